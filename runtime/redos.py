"""Regexes a backtracking engine can take exponential time on (ReDoS), found in Python's parse.

The shape that does it is a repetition whose body can end in another repetition that may take
the very characters the body starts with: in ``(a+)+`` the input ``aaaa`` splits into
iterations in 2^n ways, and a backtracking matcher tries them all when the match fails.
``(\\d+\\.)+``, ``(-[a-z]+)*`` and ``([0-9a-f]{2})+`` cannot split their input more than one
way (the body ends in something else, starts with a character the inner repetition cannot
take, or the inner repetition is of a fixed count), so they pass.

Character sets are compared on a sample of characters: ASCII, capitals, small letters, digits,
marks, spaces, punctuation and symbols of other scripts, and the pattern's own literals and
range ends (runtime.limits adds them). Enough to tell ``\\d`` from ``-`` or ``[a-z]``; two sets
that overlap only on characters outside the sample are not told apart, so this finds the
shapes written with such sets, not every one.
"""

from __future__ import annotations

import re._constants as c
from collections.abc import Callable
from typing import Any

REPEATS = (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT)
# ASCII; capital and small letters of Latin, Greek, Cyrillic, Armenian and Cherokee; letters
# of scripts without case; digits, a modifier, a mark, spaces, punctuation and symbols of other
# blocks; a private-use character (runtime.unicode_properties reads \p{L} or \p{Greek} on it)
SAMPLE = frozenset(chr(i) for i in range(9, 127)) | frozenset(
    "ÀßéüŁłΑαЖжЯԱաᎠꭰאعकกあカ한日٣३০ʰ\u0301\u00a0\u2003\u2028\u3000«—•、€©→😀\ue000"
)
_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    c.CATEGORY_DIGIT: str.isdigit,
    c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdigit(),
    c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
    c.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
    c.CATEGORY_SPACE: str.isspace,
    c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
}


def ambiguous_repeat(op: Any, argument: Any, universe: frozenset[str] = SAMPLE) -> bool:
    """Whether one node of Python's regex parse (``re._parser``) is a repetition whose body can
    split its input two ways (see above), comparing sets on ``universe`` (SAMPLE and the
    pattern's own characters). The caller walks the parse: runtime.limits does."""
    if op not in REPEATS or argument[1] <= 1:
        return False
    body = argument[2]
    starts = _first_chars(body, universe)
    return any(starts & _first_chars(inner[2], universe) for inner in _trailing_repeats(body))


def named_characters(parsed: Any) -> frozenset[str]:
    """The characters a parse writes out: its literals and the ends of its ranges."""
    found: set[int] = set()
    pending = [parsed]
    while pending:
        node = pending.pop()
        if hasattr(node, "data"):  # a SubPattern
            for op, argument in node.data:
                if op in (c.LITERAL, c.NOT_LITERAL):
                    found.add(argument)
                elif op is c.IN:
                    found.update(a for o, a in argument if o is c.LITERAL)
                    found.update(end for o, a in argument if o is c.RANGE for end in a)
                else:
                    pending.append(argument)
        elif isinstance(node, list | tuple):
            pending.extend(node)
    return frozenset(map(chr, found))


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


def _first_chars(sub: Any, universe: frozenset[str]) -> frozenset[str]:
    """Characters of ``universe`` a match of the sequence ``sub`` can start with."""
    chars: frozenset[str] = frozenset()
    for op, argument in sub:
        chars |= _item_first(op, argument, universe)
        if not _nullable(op, argument):
            break
    return chars


def _item_first(op: Any, argument: Any, universe: frozenset[str]) -> frozenset[str]:
    if op is c.LITERAL:
        return frozenset(chr(argument))
    if op is c.NOT_LITERAL:
        return universe - {chr(argument)}
    if op is c.IN:  # one matching none of the universe may match what it lacks: all of it
        return frozenset(ch for ch in universe if _in_class(argument, ch)) or universe
    if op is c.SUBPATTERN:
        return _first_chars(argument[3], universe)
    if op is c.BRANCH:
        return frozenset().union(*(_first_chars(branch, universe) for branch in argument[1]))
    if op in REPEATS:
        return _first_chars(argument[2], universe)
    if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
        return frozenset()
    return universe  # ANY, back references, ...: could be anything


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
