"""Limits on what a request may ask the grammar compiler to do.

A schema or regex is attacker-controlled input to a compiler that runs on the serving host;
these checks are cheap and run before any compile, so an oversized or pathological constraint
costs a 400, not a stalled worker. Each error names the limit it broke.
"""

from __future__ import annotations

import re
import re._parser as re_parser
from dataclasses import dataclass

import msgspec

from runtime.bounded_cache import size_bounded
from runtime.constraint import Constraint
from runtime.errors import ConstraintTooComplex, InvalidRegex
from runtime.gbnf import to_lark
from runtime.grammar_lex import grammar_depth, grammar_repeat_copies, lex_grammar
from runtime.redos import ambiguous_repeat
from runtime.regex_features import (
    ambiguous_class,
    group_depth,
    regex_loops,
    regex_nodes,
    repeated_copies,
)
from runtime.schema_walk import schema_depth, schema_patterns
from runtime.unicode_properties import python_form


@dataclass(frozen=True)
class Limits:
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 64  # JSON nesting of the schema document (about 2 per level)
    max_tools: int = 64
    max_regex_length: int = 1024
    max_regex_repeat: int = 1000  # copies all counted repetitions ask for, summed (nested multiply)
    # Unbounded repetitions (*, +, {n,}) side by side in one regex (a schema's patterns,
    # each): nothing between them, they cost xgrammar's compile quadratic time (.* x 64:
    # 0.1 s; x 256: 1.6 s; x 499: 6 s, on a vLLM server every agent shares, where llguidance's
    # fuel bound is not applied).
    max_regex_loops: int = 64
    max_grammar_bytes: int = 64 * 1024
    # Rule references followed from the start rule, each weighted by the ( and [ around it:
    # llguidance recurses through them, and about 2,000 of them overflow a thread's stack.
    max_grammar_depth: int = 256


DEFAULT_LIMITS = Limits()


def _source_size(constraint: Constraint, limits: Limits = DEFAULT_LIMITS) -> int:
    return len(constraint.source)


@size_bounded(_source_size, max_entries=4096, max_bytes=16 << 20)
def check_constraint(constraint: Constraint, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ConstraintTooComplex when the constraint is over a limit. Every request checks
    its constraint and agents resend the same tools, so a constraint that passed is
    remembered (one that fails raises, which the memo does not keep)."""
    param = constraint.param
    if constraint.is_json:
        what = (
            "the tools' union schema (every tool's parameters together, as enforced)"
            if constraint.kind == "tools"
            else None
        )
        _check_schema_limits(constraint.source.encode(), limits, param, what)
    elif constraint.kind == "regex":
        check_regex(constraint.source, limits)
    else:
        size = len(constraint.source.encode())
        if size > limits.max_grammar_bytes:
            raise ConstraintTooComplex(
                f"grammar is {size} bytes; max_grammar_bytes is {limits.max_grammar_bytes}",
                param=param,
            )
        lark = _lark_or_none(constraint.source)
        lexed = lex_grammar(lark or constraint.source)  # read once for the three checks below
        copies = grammar_repeat_copies(lexed)
        if copies > limits.max_regex_repeat:
            raise ConstraintTooComplex(
                f"grammar asks for {copies} copies of items (its ~ repetitions, summed);"
                f" max_regex_repeat is {limits.max_regex_repeat}",
                param=param,
            )
        if lark is None:
            return  # not a grammar at all: validation says why
        for text in lexed.schemas:
            _check_schema_limits(text, limits, param, what="%json schema in the grammar")
        depth = grammar_depth(lexed)
        if depth > limits.max_grammar_depth:
            raise ConstraintTooComplex(
                f"grammar nests {depth} levels deep (rule references followed from its start"
                f" rule, weighted by the groups around them); max_grammar_depth is"
                f" {limits.max_grammar_depth}",
                param=param,
            )


def check_schema_bounds(text: bytes, limits: Limits, param: str, what: str | None = None) -> None:
    """The size and depth limits alone, on a schema's JSON text: cheap, so they run before a
    schema is checked against its metaschema or cached (a 1 MB schema took 27 s to check,
    and was kept). The depth of a text is remembered: agents resend the same tools.
    ``what`` names the schema in the error (default: ``param``, quoted)."""
    what = what or f"'{param}'"
    if len(text) > limits.max_schema_bytes:
        raise ConstraintTooComplex(
            f"{what} is {len(text)} bytes; max_schema_bytes is {limits.max_schema_bytes}",
            param=param,
        )
    depth = _depth_of_text(text)
    if depth > limits.max_schema_depth:
        deep = "too deep to read" if depth == _TOO_DEEP else f"{depth} levels deep"
        raise ConstraintTooComplex(
            f"{what} nests {deep} with its $refs followed; max_schema_depth is"
            f" {limits.max_schema_depth}",
            param=param,
        )


_TOO_DEEP = 10**9


@size_bounded(len, max_entries=1024, max_bytes=16 << 20)  # texts within max_schema_bytes only
def _depth_of_text(text: bytes) -> int:
    try:
        return schema_depth(msgspec.json.decode(text))
    except RecursionError:
        return _TOO_DEEP
    except msgspec.DecodeError:
        return 0  # a %json block that is not JSON: validation says why


def _check_schema_limits(text: bytes, limits: Limits, param: str, what: str | None = None) -> None:
    """The size and depth bounds, then every `pattern` as a regex constraint is limited
    (schema_check.check_schema is the other check: valid, local refs, exact)."""
    check_schema_bounds(text, limits, param, what)
    try:
        schema = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return  # a %json block that is not JSON: validation says why
    for pattern in schema_patterns(schema):
        check_regex(pattern, limits, param)


def _lark_or_none(grammar: str) -> str | None:
    try:
        return to_lark(grammar)
    except ValueError:
        return None


def check_tool_count(count: int, limits: Limits = DEFAULT_LIMITS) -> None:
    if count > limits.max_tools:
        raise ConstraintTooComplex(f"{count} tools; max_tools is {limits.max_tools}", param="tools")


# The regex module, which checks outputs, recurses per group: 200 nested groups overflowed
# Python's stack there (a 500, after the model had run). No real pattern nests 32 deep.
MAX_REGEX_GROUP_DEPTH = 32


def check_regex(pattern: str, limits: Limits = DEFAULT_LIMITS, param: str = "regex") -> None:
    """Reject long patterns, huge counted repetitions and nested quantifiers. The DFA-based
    backends do not backtrack, but counted repetitions and nested stars blow up their
    automata, and the output is checked again by a backtracking engine (under a deadline:
    runtime.planning)."""
    if len(pattern) > limits.max_regex_length:
        raise ConstraintTooComplex(
            f"regex is {len(pattern)} characters; max_regex_length is {limits.max_regex_length}",
            param=param,
        )
    if (depth := group_depth(pattern)) > MAX_REGEX_GROUP_DEPTH:
        raise ConstraintTooComplex(
            f"regex {pattern[:80]!r} nests groups {depth} deep; at most"
            f" {MAX_REGEX_GROUP_DEPTH} are read",
            param=param,
        )
    ambiguous = ambiguous_class(pattern)
    if ambiguous is not None:  # before Python's parser, which would warn on stderr
        raise InvalidRegex(f"the regex {pattern[:80]!r} has {ambiguous}", param=param)
    try:
        re_parser.parse(python_form(pattern).text)
    except OverflowError:
        raise ConstraintTooComplex(
            f"regex {pattern[:80]!r} has a repetition bound past 2**32", param=param
        ) from None
    except re.error:
        pass  # validation says why
    loops = regex_loops(pattern)
    if loops > limits.max_regex_loops:
        raise ConstraintTooComplex(
            f"regex {pattern[:80]!r} puts {loops} unbounded repetitions (*, + or {{n,}}) side"
            f" by side; max_regex_loops is {limits.max_regex_loops}: with nothing between"
            " them, compiling it is slow; part them with what the text holds between",
            param=param,
        )
    copies = repeated_copies(pattern)
    if copies > limits.max_regex_repeat:
        raise ConstraintTooComplex(
            f"regex {pattern[:80]!r} asks for {copies} copies of pieces (counted repetitions,"
            f" multiplied when nested, summed over the pattern); max_regex_repeat is"
            f" {limits.max_regex_repeat}",
            param=param,
        )
    if any(ambiguous_repeat(op, argument) for op, argument, _ in regex_nodes(pattern)):
        raise ConstraintTooComplex(
            "regex has a nested quantifier that can split its input many ways (a repeated"
            " group ending in a repetition of the characters the group starts with, as in"
            " (a+)+ or (\\w+\\s?)*); rewrite it so the two cannot overlap",
            param=param,
        )
