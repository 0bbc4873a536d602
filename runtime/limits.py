"""Limits on what a request may ask the grammar compiler to do.

A schema or regex is attacker-controlled input to a compiler that runs on the serving host;
these checks are cheap and run before any compile, so an oversized or pathological constraint
costs a 400, not a stalled worker. Each error names the limit it broke.
"""

from __future__ import annotations

import functools
import re
import re._constants as re_constants
import re._parser as re_parser
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runtime.constraint import Constraint, to_lark
from runtime.errors import ConstraintTooComplex
from runtime.redos import REPEATS, ambiguous_repeat


@dataclass(frozen=True)
class Limits:
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 64  # JSON nesting of the schema document (about 2 per level)
    max_tools: int = 64
    max_regex_length: int = 1024
    max_regex_repeat: int = 1000  # copies all counted repetitions ask for, summed (nested multiply)
    max_grammar_bytes: int = 64 * 1024


DEFAULT_LIMITS = Limits()


@functools.lru_cache(maxsize=4096)
def check_constraint(constraint: Constraint, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ConstraintTooComplex when the constraint is over a limit. Every request checks
    its constraint and agents resend the same tools, so a constraint that passed is
    remembered (one that fails raises, which the cache does not keep)."""
    param = constraint.param
    if constraint.is_json:
        size = len(constraint.source.encode())
        if size > limits.max_schema_bytes:
            raise ConstraintTooComplex(
                f"schema is {size} bytes; max_schema_bytes is {limits.max_schema_bytes}",
                param=param,
            )
        schema = constraint.schema()
        depth = schema_depth(schema)
        if depth > limits.max_schema_depth:
            raise ConstraintTooComplex(
                f"schema nests {depth} levels deep; max_schema_depth is {limits.max_schema_depth}",
                param=param,
            )
        for pattern in schema_patterns(schema):
            check_regex(pattern, limits, param)
    elif constraint.kind == "regex":
        check_regex(constraint.source, limits)
    else:
        size = len(constraint.source.encode())
        if size > limits.max_grammar_bytes:
            raise ConstraintTooComplex(
                f"grammar is {size} bytes; max_grammar_bytes is {limits.max_grammar_bytes}",
                param=param,
            )
        copies = grammar_repeat_copies(constraint.source)
        if copies > limits.max_regex_repeat:
            raise ConstraintTooComplex(
                f"grammar asks for {copies} copies of items (its ~ repetitions, summed);"
                f" max_regex_repeat is {limits.max_regex_repeat}",
                param=param,
            )


# Lark syntax the repetition scan must not read into: string and regex literals, comments.
_GRAMMAR_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_GRAMMAR_COMMENT = re.compile(r"//[^\n]*")
_GRAMMAR_REGEX = re.compile(r"/(?:[^/\\\n]|\\.)+/[a-z]*")
# item ~ n, item ~ m..n, item{n}, item{m,n}: the upper bound (or the lower, when open)
_GRAMMAR_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?|\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_HUGE = 10**9  # a bound written with more digits counts as this (int() of 5,000 digits fails)
_GRAMMAR_PAREN = re.compile(r"[()]")
_SPACES = re.compile(r"\s*")


def grammar_repeat_copies(grammar: str) -> int:
    """Items a Lark grammar's counted repetitions ask for: each bound times the bounds of the
    groups around it, summed (``("a"~40)~40`` is 40 x 40 + 40). llguidance expands each
    into that many items (and gives up past 50,000 while decoding); the counted repetitions
    inside /regex/ terminals add up as in a regex. GBNF is read in its Lark form.
    Repetitions of a rule by another rule are not multiplied."""
    try:
        grammar = to_lark(grammar)
    except ValueError:
        pass  # not a grammar at all: validation says why
    bare = _GRAMMAR_COMMENT.sub("", _GRAMMAR_STRING.sub('""', grammar))
    regex_copies = sum(
        repeated_copies(m.group()[1 : m.group().rindex("/")]) for m in _GRAMMAR_REGEX.finditer(bare)
    )
    bare = _GRAMMAR_REGEX.sub("/x/", bare)
    bound_at = {m.start(): _repeat_bound(m) for m in _GRAMMAR_REPEAT.finditer(bare)}
    parens = [(m.start(), m.group()) for m in _GRAMMAR_PAREN.finditer(bare)]
    group_bound: dict[int, int] = {}  # where a group opens -> the bound repeating it
    opened: list[int] = []
    for at, paren in parens:
        if paren == "(":
            opened.append(at)
        elif opened:
            group_bound[opened.pop()] = bound_at.get(_SPACES.match(bare, at + 1).end(), 1)
    # One pass in text order: the product of the bounds of the groups around each repetition.
    total, scale = regex_copies, [1]  # the {m,n} inside /regex/ terminals are not multiplied
    events = sorted([*parens, *((at, "") for at in bound_at)])
    for at, paren in events:
        if paren == "(":
            scale.append(min(scale[-1] * group_bound.get(at, 1), _HUGE))
        elif paren == ")":
            if len(scale) > 1:
                scale.pop()
        else:
            total += bound_at[at] * scale[-1]
    return total


def _repeat_bound(match: re.Match[str]) -> int:
    digits = [d for d in match.groups() if d]
    if any(len(d) > 9 for d in digits):
        return _HUGE
    low_tilde, high_tilde, low_brace, high_brace = match.groups()
    if low_tilde is not None:
        return int(high_tilde or low_tilde)
    return int(high_brace or low_brace)


def check_tool_count(count: int, limits: Limits = DEFAULT_LIMITS) -> None:
    if count > limits.max_tools:
        raise ConstraintTooComplex(f"{count} tools; max_tools is {limits.max_tools}", param="tools")


def schema_depth(value: Any) -> int:
    """Nesting depth of the JSON value (iterative: a deep schema must not blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def schema_patterns(schema: Any) -> list[str]:
    """Every regex in a schema (``pattern`` values, ``patternProperties`` keys): the same
    compilers build automata from them as from a ``regex`` constraint."""
    found, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                found.extend(node["patternProperties"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


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
    copies = repeated_copies(pattern)
    if copies > limits.max_regex_repeat:
        raise ConstraintTooComplex(
            f"regex {pattern[:80]!r} asks for {copies} copies of pieces (counted repetitions,"
            f" multiplied when nested, summed over the pattern); max_regex_repeat is"
            f" {limits.max_regex_repeat}",
            param=param,
        )
    if any(ambiguous_repeat(op, argument) for op, argument, _ in _regex_nodes(pattern)):
        raise ConstraintTooComplex(
            "regex has a nested quantifier that can split its input many ways (a repeated"
            " group ending in a repetition of the characters the group starts with, as in"
            " (a+)+ or (\\w+\\s?)*); rewrite it so the two cannot overlap",
            param=param,
        )


def repeated_copies(pattern: str) -> int:
    """How many copies of pieces the counted repetitions ask for, in total: each repetition's
    bound times the bounds around it (``(a{10}b){20}`` is 20 + 200), summed over the pattern
    (``a{999}`` written 150 times is 149,850, though no one bound is over the limit). Read
    from Python's own parse, so every spelling counts (``{n}``, ``{m,n}``, ``{,n}``,
    ``{n,}``); an unbounded ``*`` or ``+`` is a loop, not copies. 0 when Python cannot parse
    it (validation says why)."""
    return sum(
        copies * _bound(argument) for op, argument, copies in _regex_nodes(pattern) if op in REPEATS
    )


def uses_lookaround(constraint: Constraint) -> bool:
    """Whether a regex constraint, or a pattern in a JSON schema, holds a lookahead or a
    lookbehind: automaton backends cannot enforce them, and two of ours dropped them
    silently (``(?=a)a`` let any text through)."""
    if constraint.kind == "regex":
        patterns = [constraint.source]
    elif constraint.is_json:
        patterns = schema_patterns(constraint.schema())
    else:
        return False
    return any(op in _LOOKAROUNDS for pattern in patterns for op, _, _ in _regex_nodes(pattern))


_LOOKAROUNDS = (re_constants.ASSERT, re_constants.ASSERT_NOT)


def _regex_nodes(pattern: str) -> Iterator[tuple[Any, Any, int]]:
    """Every node of Python's parse of ``pattern``, nested ones too, as (opcode, argument,
    copies): how many times the counted repetitions around the node repeat it. Nothing when
    Python cannot parse the pattern."""
    try:
        parsed = re_parser.parse(pattern)
    except re.error:
        return
    pending: list[tuple[Any, int]] = [(parsed, 1)]
    while pending:
        node, copies = pending.pop()
        if isinstance(node, re_parser.SubPattern):
            for op, argument in node:
                yield op, argument, copies
                if op in REPEATS:
                    pending.append((argument[2], copies * _bound(argument)))
                else:
                    pending.append((argument, copies))
        elif isinstance(node, list | tuple):
            pending.extend((child, copies) for child in node)


def _bound(repeat: tuple[int, int, Any]) -> int:
    """The copies one repetition (min, max, body) asks for: its upper bound, or its lower
    one when unbounded (``{5,}`` unrolls 5, then loops); at least 1."""
    low, high, _ = repeat
    return max(low if high == re_constants.MAXREPEAT else high, 1)
