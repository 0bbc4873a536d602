"""Unicode property escapes (``\\p{L}``, ``\\P{Nd}``, ``\\p{Script=Greek}``) in constraint
regexes, which Python's ``re`` does not have.

JSON Schema patterns are ECMA-262 regexes, where ``\\p{L}`` is the usual way to say "a letter
in any script", and llguidance (Rust's regex syntax) enforces them. Python's ``re``, which
reads every regex here for its limits (runtime.limits), refuses them. So:

- a property name must be one both the ``regex`` module (what the output check runs) and
  llguidance know, in the plain ``Name`` or ``Name=Value`` form (``!=`` means different
  things to the three engines);
- Python's parser reads the pattern with each escape replaced by one private-use character
  (a literal in any context: inside or outside a class, in verbose mode), and ``expand`` then
  turns those characters in the parse into the sample characters (runtime.redos.SAMPLE) the
  escape matches, so the nested-quantifier check compares them like any other class.
"""

from __future__ import annotations

import functools
import re
import re._constants as c
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llguidance
import regex

from runtime.redos import OTHER, SAMPLE

# \p or \P, then {name} or a one-letter name (Rust and the regex module read \pL as \p{L});
# neither: malformed
_ESCAPE = re.compile(r"\\([pP])(?:\{([^{}]*)\}|([A-Za-z]))?")
_NAME = re.compile(r"[A-Za-z0-9_ -]{1,64}(?:[=:][A-Za-z0-9_ .-]{1,64})?")
_FIRST_PLACEHOLDER = 0xF0000  # Supplementary Private Use Area-A: no property means anything here


@dataclass(frozen=True)
class PythonForm:
    """A pattern as Python's parser can read it, and what each placeholder stands for."""

    text: str
    classes: dict[int, tuple[tuple[int, int], ...]]  # placeholder -> code point ranges
    escapes: dict[str, str]  # placeholder -> the escape as written

    def restore(self, message: str) -> str:
        """``message`` (about ``text``) with the escapes written back for the placeholders."""
        for placeholder, escape in self.escapes.items():
            message = message.replace(placeholder, escape)
        return message

    def expand(self, parsed: Any) -> Any:
        """``parsed`` (Python's parse of ``text``) with each placeholder replaced, in place, by
        the class of sample characters its escape matches."""
        if self.classes:
            for sub in _subpatterns(parsed):
                sub.data[:] = [self._expand_item(op, arg) for op, arg in sub.data]
        return parsed

    def _expand_item(self, op: Any, arg: Any) -> tuple[Any, Any]:
        if op is c.LITERAL and arg in self.classes:
            return c.IN, self._items(arg)
        if op is c.NOT_LITERAL and arg in self.classes:
            return c.IN, [(c.NEGATE, None), *self._items(arg)]
        if op is c.IN and any(o is c.LITERAL and a in self.classes for o, a in arg):
            items: list[tuple[Any, Any]] = []
            for o, a in arg:
                items.extend(self._items(a) if o is c.LITERAL and a in self.classes else [(o, a)])
            return c.IN, items
        return op, arg

    def _items(self, placeholder: int) -> list[tuple[Any, Any]]:
        return [(c.RANGE, span) for span in self.classes[placeholder]]


def python_form(pattern: str) -> PythonForm:
    """``pattern`` with each property escape replaced by a placeholder character. An escape
    that is not well formed or whose name is unknown is left as written, for Python's parser
    to refuse (``property_error`` says why first)."""
    if "\\p" not in pattern and "\\P" not in pattern:
        return PythonForm(pattern, {}, {})
    out: list[str] = []
    placeholders: dict[str, int] = {}
    classes: dict[int, tuple[tuple[int, int], ...]] = {}
    start = 0
    for match in _escapes(pattern):
        spans = _sample_matches(match.group(0))
        if spans is None:
            continue
        placeholder = placeholders.setdefault(
            match.group(0), _FIRST_PLACEHOLDER + len(placeholders)
        )
        classes[placeholder] = spans
        out += [pattern[start : match.start()], chr(placeholder)]
        start = match.end()
    out.append(pattern[start:])
    escapes = {chr(placeholder): escape for escape, placeholder in placeholders.items()}
    return PythonForm("".join(out), classes, escapes)


def property_error(pattern: str) -> str | None:
    """Why a property escape in ``pattern`` cannot be used, or None."""
    for match in _escapes(pattern):
        name = match.group(2) if match.group(2) is not None else match.group(3)
        if name is None or not _NAME.fullmatch(name):
            return (
                f"has the property escape {match.group(0)!r}, not of the form \\p{{Name}} or"
                " \\p{Name=Value}"
            )
        if _sample_matches(match.group(0)) is None:
            return (
                f"has the property escape {match.group(0)!r}: an unknown Unicode property (to"
                " the output check's regex module or to the decoder's Rust regex)"
            )
    return None


def _escapes(pattern: str) -> Iterator[re.Match[str]]:
    """The property escapes of ``pattern``, skipping escaped backslashes (``\\\\p{L}``)."""
    i = pattern.find("\\")
    while i >= 0:
        match = _ESCAPE.match(pattern, i)
        if match is not None:
            yield match
            i = pattern.find("\\", match.end())
        else:
            i = pattern.find("\\", i + 2)


@functools.lru_cache(maxsize=4096)  # every property spelling both engines know, about 100 B each
def _sample_matches(escape: str) -> tuple[tuple[int, int], ...] | None:
    """The code point ranges of the sample characters ``escape`` matches (with OTHER, which
    stands for characters outside the sample, for every ``\\p`` and for a ``\\P`` matching no
    sample character), or None when the ``regex`` module or llguidance does not know it."""
    try:
        compiled = regex.compile(escape)
    except regex.error:
        return None
    if llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_regex(escape)):
        return None
    points = sorted(ord(ch) for ch in SAMPLE - {OTHER} if compiled.fullmatch(ch))
    if escape[1] == "p" or not points:  # a \P that matches sample characters needs no OTHER:
        points.append(ord(OTHER))  # \p{L}+\P{L}+ must not overlap
    return tuple(_runs(points))


def _runs(points: list[int]) -> Iterator[tuple[int, int]]:
    """Sorted code points as (first, last) runs of consecutive ones."""
    first = last = points[0]
    for point in points[1:]:
        if point != last + 1:
            yield first, last
            first = point
        last = point
    yield first, last


def _subpatterns(parsed: Any) -> Iterator[Any]:
    """Every SubPattern in Python's parse, nested ones too (a class's items hold none)."""
    pending = [parsed]
    while pending:
        node = pending.pop()
        if hasattr(node, "data"):  # a SubPattern
            yield node
            pending.extend(arg for op, arg in node.data if op is not c.IN)
        elif isinstance(node, list | tuple):
            pending.extend(node)
