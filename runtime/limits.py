"""Limits on what a request may ask the grammar compiler to do.

A schema or regex is attacker-controlled input to a compiler that runs on the serving host;
these checks are cheap and run before any compile, so an oversized or pathological constraint
costs a 400, not a stalled worker. Each error names the limit it broke.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runtime.constraint import Constraint
from runtime.errors import ConstraintTooComplex


@dataclass(frozen=True)
class Limits:
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 64  # JSON nesting of the schema document (about 2 per level)
    max_tools: int = 64
    max_regex_length: int = 1024
    max_regex_repeat: int = 1000  # largest {m,n} bound
    max_grammar_bytes: int = 64 * 1024


DEFAULT_LIMITS = Limits()

_PARAM = {"json": "response_format", "tools": "tools", "regex": "regex", "ebnf": "grammar"}


def check_constraint(constraint: Constraint, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ConstraintTooComplex when the constraint is over a limit."""
    param = _PARAM[constraint.kind]
    if constraint.is_json:
        size = len(constraint.source.encode())
        if size > limits.max_schema_bytes:
            raise ConstraintTooComplex(
                f"schema is {size} bytes; max_schema_bytes is {limits.max_schema_bytes}",
                param=param,
            )
        depth = schema_depth(constraint.schema())
        if depth > limits.max_schema_depth:
            raise ConstraintTooComplex(
                f"schema nests {depth} levels deep; max_schema_depth is {limits.max_schema_depth}",
                param=param,
            )
    elif constraint.kind == "regex":
        check_regex(constraint.source, limits)
    else:
        size = len(constraint.source.encode())
        if size > limits.max_grammar_bytes:
            raise ConstraintTooComplex(
                f"grammar is {size} bytes; max_grammar_bytes is {limits.max_grammar_bytes}",
                param=param,
            )


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


_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
# A quantified group whose body itself ends in a quantifier: (a+)+, (\w*)*, (x{2,}){3,} ...
_NESTED_QUANTIFIER = re.compile(r"[*+}]\)[*+{]|[*+]\)\?")


def check_regex(pattern: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Reject long patterns, huge counted repetitions and nested quantifiers. The DFA-based
    backends do not backtrack, but counted repetitions and nested stars blow up their
    automata, and the post-hoc path checks output with Python's backtracking ``re``."""
    if len(pattern) > limits.max_regex_length:
        raise ConstraintTooComplex(
            f"regex is {len(pattern)} characters; max_regex_length is {limits.max_regex_length}",
            param="regex",
        )
    for m in _REPEAT.finditer(pattern):
        bound = max(int(m.group(1)), int(m.group(2) or 0))
        if bound > limits.max_regex_repeat:
            raise ConstraintTooComplex(
                f"regex repetition {m.group(0)} exceeds max_regex_repeat {limits.max_regex_repeat}",
                param="regex",
            )
    if _NESTED_QUANTIFIER.search(pattern):
        raise ConstraintTooComplex(
            "regex has a nested quantifier (a quantified group ending in a quantifier, as "
            "in (a+)+); rewrite it without nesting",
            param="regex",
        )
