"""Unicode property escapes read through Python's parser: placeholders in any context, the
characters they match in the parse, and the nested-quantifier check on them."""

from __future__ import annotations

import re._constants as c
import re._parser as re_parser

import pytest

from runtime.errors import ConstraintTooComplex
from runtime.limits import check_regex
from runtime.regex_features import regex_problem
from runtime.unicode_properties import python_form


def _class_chars(pattern: str) -> set[str]:
    """The sample characters Python's expanded parse of a one-class ``pattern`` matches."""
    form = python_form(pattern)
    ((op, items),) = form.expand(re_parser.parse(form.text)).data
    assert op is c.IN
    negate = bool(items) and items[0][0] is c.NEGATE
    chars = {chr(p) for o, a in items if o is c.RANGE for p in range(a[0], a[1] + 1)}
    return {"negated"} | chars if negate else chars


def test_a_placeholder_is_one_character_in_any_context() -> None:
    form = python_form("\\p{L}[\\p{L}x][^\\p{Nd}]\\\\p{L}")
    assert len(form.text) == len("P[Px][^Q]\\\\p{L}")  # the escaped backslash is left alone
    assert form.restore(form.text) == "\\p{L}[\\p{L}x][^\\p{Nd}]\\\\p{L}"
    assert python_form("[a-z]+").text == "[a-z]+"
    spellings = python_form("\\p{Lo}\\p{lo}\\p{L_o}")  # one name to every engine
    assert len(set(spellings.text)) == 1 and spellings.restore(spellings.text[0]) == "\\p{Lo}"


def test_a_placeholder_is_no_character_the_pattern_holds() -> None:
    form = python_form("\U000f0000\\p{L}")
    assert form.text[0] == "\U000f0000" and form.text[1] != "\U000f0000"
    every = "".join(map(chr, range(0xF0000, 0xFFFFE)))
    assert "bad escape \\p" in (regex_problem(f"[{every}]\\p{{L}}") or "")  # none left
    assert regex_problem("[\\U000f0000-\\U000f0005]\\p{L}") is None  # not taken for \\p{L}
    assert regex_problem("\U000f0000\\p{L}[\U000f0000-a]") == (
        "does not compile: bad character range \U000f0000-a at position 3"
    )


def test_an_escape_stands_for_the_characters_it_matches() -> None:
    letters = _class_chars("\\p{L}")
    assert {"a", "Z", "é", "α", "日", "Ա", "ꭰ"} <= letters and not {"1", "_", " "} & letters
    assert _class_chars("\\p{Script=Greek}") == {"Α", "α"}
    assert _class_chars("\\p{Ogham}") == set()  # none in the sample: redos takes all of it
    assert _class_chars("\\p{nd}") == _class_chars("\\p{Nd}")
    non_letters = _class_chars("\\P{L}")
    assert {"1", "_", " ", "٣"} <= non_letters and "a" not in non_letters
    assert _class_chars("[^\\p{Nd}]") == {"negated", "٣", "३", "০", "០"} | set("0123456789")


@pytest.mark.parametrize(
    "pattern, refused",
    [
        ("(\\p{Greek}+[a-z]+)*!", False),  # disjoint on the sample
        ("(\\p{Greek}+[α-ω]+)*!", True),
        ("(\\p{L}+\\P{L}+)*!", False),  # a class and its complement never overlap
        ("(\\p{L}+\\d+)*!", False),
        ("^\\p{L}+(\\s\\p{L}+)*$", False),
        ("(\\p{Lu}\\p{Ll}+,)*", False),
        ("([\\p{L}0]\\p{L}*)+!", True),  # a class holding an escape
        ("(\\p{Script=Greek}\\P{Ll}*)+!", True),  # capital alpha
        ("(\\p{Script=Cherokee}\\P{Lu}*)+!", True),  # Cherokee small letters
        ("(\\p{Script=Armenian}\\w*)+!", True),
        ("(\\p{Script=Bengali}\\d*)+!", True),
        ("(\\p{Script=Armenian}[^\\p{Script=Greek}]*)+!", True),
        ("(\\p{Ogham}+)+!", True),  # a script the sample lacks: all of it
        ("(\\p{Georgian}\\s*)+", False),  # one it has
        ("(\\p{L}\\p{Mc}*)+", False),  # Indic vowel signs: a category it has
        ("(\\p{L}\\p{Cf}*)+", False),  # joiners
        ("\\p{Lu}(\\U000f0000\\p{Lu}*)+", False),  # a written-out private-use character
        ("([^\\P{Ogham}]+)+!", True),
        ("([^\\p{Ogham}]+)+!", True),
        ("(ü\\p{L}*)+!", True),
        ("(ü[a-z]*)+!", False),
        ("(²\\d*)+!", False),  # \\d is decimal digits: not ²
        ("([\\u0100-\\u017f]+)+!", True),
    ],
)
def test_the_nested_quantifier_check_compares_properties(pattern: str, refused: bool) -> None:
    if refused:
        with pytest.raises(ConstraintTooComplex, match="nested quantifier"):
            check_regex(pattern)
    else:
        check_regex(pattern)


@pytest.mark.parametrize(
    "pattern, problem",
    [
        ("[\\p{L}-z]", "bad character range \\p{L}-z"),  # Python's message, the escape restored
        ("[!-\\p{L}]", "has the property escape '\\\\p{L}' as the end of a range"),
        ("\\p{Script:Greek}", "not of the form \\p{Name} or \\p{Name=Value}"),
        ("\\p{Script!=Greek}", "not of the form \\p{Name} or \\p{Name=Value}"),
        ("\\p{script = greek}+", None),  # names match loosely, to every engine
        ("\\pL\\PN", None),
    ],
)
def test_what_a_property_escape_may_be(pattern: str, problem: str | None) -> None:
    found = regex_problem(pattern)
    assert found is None if problem is None else problem in (found or "")
