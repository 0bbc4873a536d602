"""Regexes a backtracking engine can take exponential time on (ReDoS), found in Python's parse.

The shape that does it is a repetition whose body can end in another repetition that may take
the very characters the body starts with: in ``(a+)+`` the input ``aaaa`` splits into
iterations in 2^n ways, and a backtracking matcher tries them all when the match fails.
``(\\d+\\.)+``, ``(-[a-z]+)*`` and ``([0-9a-f]{2})+`` cannot split their input more than one
way (the body ends in something else, starts with a character the inner repetition cannot
take, or the inner repetition is of a fixed count), so they pass.

Character sets are compared on a sample of characters: ASCII, and capitals, small letters,
digits, marks, spaces, punctuation and symbols of other scripts. Enough to tell ``\\d`` from
``-`` or ``[a-z]``; a class matching none of the sample (a script or category it lacks)
counts as matching all of it. Two sets that overlap only on other characters are not told
apart, so this finds the shapes written with such sets, not every one.
"""

from __future__ import annotations

import functools
import re._constants as c
from collections.abc import Callable
from typing import Any

REPEATS = (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT)
# ASCII; capital and small letters of Latin, Greek, Cyrillic, Armenian, Georgian, Coptic,
# Cherokee and Adlam; a letter of each of the widely written scripts without case; a character
# of every general category (Lt, Lm, Mn, Mc, Me, Nd of several scripts, Nl, No, Pf, Pi, Pd,
# Po, Zs, Zl, Zp, Cf, Co, Cn, Sc, Sm, So): runtime.unicode_properties reads \p{...} on them
SAMPLE = frozenset(chr(i) for i in range(9, 127)) | frozenset(
    "ÀßéüŁłǅΑαЖжЯԱաႠაⲁᎠꭰ𞤀𞤢אعܐހकগਗગଗதతಕമසกລཀမកᠠአあカㄅ한日ꀀᐁⴰߊꦄᬅꨀꓐʰ"
    "٣३০០Ⅰ²\u0301\u093e\u20dd\u00a0\u2003\u2028\u2029\u3000«»—•、"
    "\u200c\ue000\u0378€©→😀"
)
_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    c.CATEGORY_DIGIT: str.isdecimal,  # \d is Nd to every engine here, not isdigit's ²
    c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdecimal(),
    c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
    c.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
    c.CATEGORY_SPACE: str.isspace,
    c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
}


def ambiguous_repeat(op: Any, argument: Any) -> bool:
    """Whether one node of Python's regex parse (``re._parser``) is a repetition whose body can
    split its input two ways (see above). The caller walks the parse: runtime.limits.check_regex
    does."""
    if op not in REPEATS or argument[1] <= 1:
        return False
    body = argument[2]
    starts = _first_chars(body)
    return any(starts & _first_chars(inner[2]) for inner in _trailing_repeats(body))


def _trailing_repeats(sub: Any) -> list[Any]:
    """The variable-count repetitions the sequence ``sub`` can end in, looking past trailing
    items that can match nothing (``(\\w+\\s?)*`` ends in ``\\w+``)."""
    found: list[Any] = []
    for op, argument in reversed(list(sub)):
        if op in REPEATS and argument[1] > 1 and argument[0] != argument[1]:
            found.append(argument)
        elif op is c.SUBPATTERN:
            found += _trailing_repeats(argument[3])
        elif op is c.BRANCH:
            for branch in argument[1]:
                found += _trailing_repeats(branch)
        if not _nullable(op, argument):
            break
    return found


def _first_chars(sub: Any) -> frozenset[str]:
    """Sample characters a match of the sequence ``sub`` can start with."""
    chars: frozenset[str] = frozenset()
    for op, argument in sub:
        chars |= _item_first(op, argument)
        if not _nullable(op, argument):
            break
    return chars


def _item_first(op: Any, argument: Any) -> frozenset[str]:
    if op is c.LITERAL:
        return frozenset(chr(argument))
    if op is c.NOT_LITERAL:
        return SAMPLE - {chr(argument)}
    if op is c.IN:
        return _class_sample(tuple(argument))
    if op is c.SUBPATTERN:
        return _first_chars(argument[3])
    if op is c.BRANCH:
        return frozenset().union(*(_first_chars(branch) for branch in argument[1]))
    if op in REPEATS:
        return _first_chars(argument[2])
    if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
        return frozenset()
    return SAMPLE  # ANY, back references, ...: could be anything


@functools.lru_cache(maxsize=256)  # nested repetitions ask for the same class again
def _class_sample(items: tuple[tuple[Any, Any], ...]) -> frozenset[str]:
    """The sample characters a class matches; one matching none of them may match what the
    sample lacks (a script or category it has no character of): all of it."""
    return frozenset(ch for ch in SAMPLE if _in_class(items, ch)) or SAMPLE


def _nullable(op: Any, argument: Any) -> bool:
    """Whether the item can match the empty string."""
    if op in REPEATS:
        return argument[0] == 0 or all(_nullable(o, a) for o, a in argument[2])
    if op is c.SUBPATTERN:
        return all(_nullable(o, a) for o, a in argument[3])
    if op is c.BRANCH:
        return any(all(_nullable(o, a) for o, a in branch) for branch in argument[1])
    return op in (c.AT, c.ASSERT, c.ASSERT_NOT)


def _in_class(items: Any, ch: str) -> bool:
    negate, hit = False, False
    for op, argument in items:
        if op is c.NEGATE:
            negate = True
        elif op is c.LITERAL:
            hit = hit or ord(ch) == argument
        elif op is c.RANGE:
            hit = hit or argument[0] <= ord(ch) <= argument[1]
        elif op is c.CATEGORY:
            hit = hit or _CATEGORIES.get(argument, lambda _: True)(ch)
        else:
            hit = True  # an opcode not modelled here: assume it may match
    return hit != negate
