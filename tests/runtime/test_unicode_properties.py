"""Unicode property escapes read through Python's parser: placeholders in any context, the
sample characters they match in the parse, and the nested-quantifier check on them."""

from __future__ import annotations

import re._constants as c
import re._parser as re_parser

import pytest

from runtime.errors import ConstraintTooComplex
from runtime.limits import check_regex, regex_problem
from runtime.redos import OTHER
from runtime.unicode_properties import python_form


def _class_chars(pattern: str) -> set[str]:
    """The sample characters Python's expanded parse of a one-class ``pattern`` matches."""
    form = python_form(pattern)
    ((op, items),) = form.expand(re_parser.parse(form.text)).data
    assert op is c.IN
    negate = items[0][0] is c.NEGATE
    chars = {chr(p) for o, a in items if o is c.RANGE for p in range(a[0], a[1] + 1)}
    return {"negated"} | chars if negate else chars


def test_a_placeholder_is_one_character_in_any_context() -> None:
    form = python_form("\\p{L}[\\p{L}x][^\\p{Nd}]\\\\p{L}")
    assert len(form.text) == len("P[Px][^Q]\\\\p{L}")  # the escaped backslash is left alone
    assert form.restore(form.text) == "\\p{L}[\\p{L}x][^\\p{Nd}]\\\\p{L}"
    assert python_form("[a-z]+").text == "[a-z]+"


def test_an_escape_stands_for_the_sample_characters_it_matches() -> None:
    letters = _class_chars("\\p{L}")
    assert {"a", "Z", "é", "α", "日", OTHER} <= letters and not {"1", "_", " "} & letters
    assert _class_chars("\\p{Script=Greek}") == {"α", OTHER}
    assert _class_chars("\\p{Cherokee}") == {OTHER}  # no sample character: stands for others
    non_letters = _class_chars("\\P{L}")
    assert {"1", "_", " "} <= non_letters and not {"a", OTHER} & non_letters
    assert _class_chars("[^\\p{Nd}]") == {"negated", OTHER} | {str(d) for d in range(10)} | {"٣"}


@pytest.mark.parametrize(
    "pattern, refused",
    [
        ("(\\p{Greek}+[a-z]+)*!", False),  # disjoint on the sample
        ("(\\p{Greek}+[α-ω]+)*!", True),
        ("(\\p{L}+\\P{L}+)*!", False),  # a class and its complement never overlap
        ("(\\p{L}+\\d+)*!", False),
        ("(\\p{Lu}\\p{Ll}+,)*", False),
        ("(\\p{Lu}+\\p{Cherokee}+)*!", True),  # Cherokee letters are Lu: outside the sample
        ("([^\\P{L}]+\\p{Cherokee}+)*!", True),
        ("(\\P{Greek}+)+!", True),
    ],
)
def test_the_nested_quantifier_check_compares_properties(pattern: str, refused: bool) -> None:
    if refused:
        with pytest.raises(ConstraintTooComplex, match="nested quantifier"):
            check_regex(pattern)
    else:
        check_regex(pattern)


def test_python_s_message_names_the_escape_not_its_placeholder() -> None:
    assert regex_problem("[\\p{L}-z]") == (
        "does not compile: bad character range \\p{L}-z at position 1"
    )
