"""The limits that keep a constraint cheap to check and compile (runtime/limits.py) and the
measures they read (regex_features, schema_walk, grammar_lex): every limit is an inclusive
maximum, and no way of writing a constraint measures it smaller than it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runtime.constraint import Constraint
from runtime.errors import ConstraintTooComplex, InvalidRegex
from runtime.gbnf import to_lark
from runtime.grammar_lex import grammar_depth, grammar_repeat_copies, lex_grammar
from runtime.limits import Limits, check_constraint, check_regex, check_schema_bounds
from runtime.regex_features import regex_loops, repeated_copies
from runtime.schema_walk import schema_depth

SCHEMA = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
GRAMMAR = Constraint.ebnf('start: a\na: "x" b\nb: "y"\n')
REPEATED = Constraint.ebnf('start: "a"~5\n')


def _lexed(grammar: Constraint) -> Any:
    return lex_grammar(to_lark(grammar.source))


# A schema's patterns are each held to the regex limits: 2 unbounded repetitions side by
# side in the first (x+y*), none in the second (the dash and the slash part them).
PATTERNS = Constraint.json_schema(
    {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^x+y*$"},
            "b": {"type": "string", "pattern": "^[a-z]+-[0-9]+/[a-z]*$"},
        },
    }
)

CASES: list[tuple[str, Callable[[Limits], None], int]] = [
    ("max_schema_bytes", lambda lim: check_constraint(SCHEMA, lim), len(SCHEMA.source.encode())),
    (
        "max_schema_depth",
        lambda lim: check_constraint(SCHEMA, lim),
        schema_depth({"type": "object", "properties": {"a": {"type": "string"}}}),
    ),
    ("max_regex_length", lambda lim: check_regex("abcd", lim), 4),
    ("max_regex_repeat", lambda lim: check_regex("a{5}", lim), repeated_copies("a{5}")),
    ("max_regex_loops", lambda lim: check_regex("a*b+c{2,}d", lim), regex_loops("a*b+c{2,}d")),
    ("max_regex_loops", lambda lim: check_constraint(PATTERNS, lim), 2),
    ("max_grammar_bytes", lambda lim: check_constraint(GRAMMAR, lim), len(GRAMMAR.source.encode())),
    (
        "max_grammar_depth",
        lambda lim: check_constraint(GRAMMAR, lim),
        grammar_depth(_lexed(GRAMMAR)),
    ),
    (
        "max_regex_repeat",
        lambda lim: check_constraint(REPEATED, lim),
        grammar_repeat_copies(_lexed(REPEATED)),
    ),
]


@pytest.mark.parametrize(
    ("limit", "check", "measure"), CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)]
)
def test_every_limit_is_an_inclusive_maximum(
    limit: str, check: Callable[[Limits], None], measure: int
) -> None:
    """A constraint measuring exactly the limit is accepted; one over it is refused, naming
    the limit."""
    assert measure > 1
    check(Limits(**{limit: measure}))
    with pytest.raises(ConstraintTooComplex, match=limit):
        check(Limits(**{limit: measure - 1}))


@pytest.mark.parametrize(
    ("pattern", "side_by_side"),
    [
        (".*" * 499 + "b", 499),  # xgrammar: 6 s to compile
        ("(?:.*){64}b", 64),
        ("a*b*" * 32, 64),
        ("^[a-z]+(?: [a-z]+){0,99}$", 1),  # up to 100 words: a space parts them (0.01 s)
        ("^(?:[a-z0-9-]+\\.){1,126}[a-z]{2,}$", 1),
        ("^(?:[^,]*,){99}[^,]*$", 1),
        ("(?:a*|b*)c*", 2),
    ],
)
def test_loops_are_counted_where_they_stand_side_by_side(pattern: str, side_by_side: int) -> None:
    """Only loops with nothing between them make xgrammar's compile slow (each can take what
    the next would); counted per copy of the repetition around them, ordinary patterns
    were refused (100 words, a host name of 126 labels)."""
    assert regex_loops(pattern) == side_by_side


def test_a_schema_too_deep_to_decode_is_too_complex() -> None:
    """A text nested past the decoder's recursion limit (10 kB, far under max_schema_bytes)
    is refused by the depth check itself: let through, the decode after it would raise
    RecursionError (a 500, not a 400)."""
    text = b"[" * 5000 + b"]" * 5000
    with pytest.raises(ConstraintTooComplex, match="too deep to read"):
        check_schema_bounds(text, Limits(), "grammar", what="%json schema in the grammar")


# --- runtime/regex_features.py ----------------------------------------------------------


def test_a_doubled_tilde_in_a_class_is_ambiguous() -> None:
    """`~~` inside a class is symmetric difference to Rust's regex (llguidance) and a literal
    to the others: the backends would enforce different languages."""
    with pytest.raises(InvalidRegex, match="'~~' inside a character class"):
        check_regex("[a~~b]")


def test_a_close_bracket_first_in_a_class_does_not_end_it() -> None:
    """A `]` first in a class is a literal, so `[]&&a]` is one class holding `&&` (a set
    operation to Rust's regex); read as an empty class, the operator went unseen."""
    with pytest.raises(InvalidRegex, match="'&&' inside a character class"):
        check_regex("[]&&a]")
    with pytest.raises(InvalidRegex, match="'\\[' inside a character class"):
        check_regex("[^][]")


def test_a_counted_repetition_under_a_star_is_counted() -> None:
    """A `*` may repeat zero times, but its body is still compiled: `(a{5000})*` asks for
    5,001 copies, not 0."""
    assert repeated_copies("(a{5000})*") == 5001
    with pytest.raises(ConstraintTooComplex, match="max_regex_repeat"):
        check_regex("(a{5000})*")


# --- runtime/schema_walk.py -------------------------------------------------------------


def test_a_chain_of_defs_written_last_first_is_measured_whole() -> None:
    """A $ref to a node measured earlier adds that node's depth: a chain of $defs listed last
    first measured about 3 levels instead of over 100 when it did not."""
    n = 100
    defs = {
        f"d{i}": ({"$ref": f"#/$defs/d{i + 1}"} if i < n else {"type": "string"})
        for i in reversed(range(n + 1))
    }
    schema: dict[str, Any] = {"$defs": defs, "$ref": "#/$defs/d0"}
    assert schema_depth(schema) > n
    with pytest.raises(ConstraintTooComplex, match="max_schema_depth"):
        check_constraint(Constraint.json_schema(schema))


def test_groups_nested_past_the_depth_the_output_check_reads_are_refused() -> None:
    """The regex module that checks a regex output recursed once per group: 200 nested
    groups overflowed the stack after the model had run (a 500). Parentheses inside a
    character class or escaped are characters, not groups."""
    deep = "(?:" * 33 + "a" + ")" * 33
    with pytest.raises(ConstraintTooComplex, match="nests groups 33 deep"):
        check_regex(deep)
    check_regex("(?:" * 32 + "a" + ")" * 32)
    check_regex("[(]" * 40 + r"\(" * 40 + "[^]((((]" + "(a)")
