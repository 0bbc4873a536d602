"""Unicode property escapes (``\\p{L}``, ``\\P{Nd}``, ``\\p{Script=Greek}``) in constraint
regexes, which Python's ``re`` does not have.

JSON Schema patterns are ECMA-262 regexes, where ``\\p{L}`` is the usual way to say "a letter
in any script", and llguidance (Rust's regex syntax) enforces them. Python's ``re``, which
reads every regex here for its limits (runtime.limits), refuses them. So:

- a property name must be one both the ``regex`` module (what checks a ``regex`` output) and
  llguidance know, written ``Name`` or ``Name=Value`` (``!=`` means different things to the
  engines); both match names loosely (case, spaces, ``_`` and ``-`` aside), and so does
  everything here: one placeholder and one cache entry per loose name;
- Python's parser reads the pattern with each escape replaced by a placeholder, a
  private-use character the pattern does not hold or write (a literal in any context:
  inside or outside a class, in verbose mode), and ``expand`` then turns those in the parse
  into the characters of the nested-quantifier check's sample (runtime.redos) the escape
  matches; a class left matching none of them (a script or category the sample lacks)
  counts as matching all of it there;
- an escape as the end of a range (``[!-\\p{L}]``: a character to Python, an error or a
  class to the other engines) is refused.
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

from runtime.redos import SAMPLE

# \p or \P, then {name} or a one-letter name (Rust and the regex module read \pL as \p{L});
# neither: malformed
_ESCAPE = re.compile(r"\\([pP])(?:\{([^{}]*)\}|([A-Za-z]))?")
_NAME = re.compile(r"[A-Za-z0-9_ -]{1,64}(?:=[A-Za-z0-9_ .-]{1,64})?")
_LOOSE = str.maketrans("", "", " _-")
_PRIVATE_USE = range(0xF0000, 0xFFFFE)  # Supplementary Private Use Area-A
_WRITTEN_OUT = re.compile(r"\\U([0-9A-Fa-f]{8})")  # the one escape that can write one of them


@dataclass(frozen=True)
class PythonForm:
    """A pattern as Python's parser can read it, and the escape each placeholder stands for."""

    text: str
    escapes: dict[str, str]  # placeholder -> the escape, spelled loosely
    written: dict[str, str]  # placeholder -> the escape as first written

    def restore(self, message: str) -> str:
        """``message`` (about ``text``) with the escapes written back for the placeholders."""
        for placeholder, escape in self.written.items():
            message = message.replace(placeholder, escape)
        return message

    def range_end(self, parsed: Any) -> str | None:
        """The first escape ``parsed`` (Python's parse of ``text``) uses as a range's end
        (``[!-\\p{L}]``: a character to Python, an error or a class to the other engines)."""
        for items in _classes(parsed):
            for op, arg in items:
                if op is c.RANGE and {chr(arg[0]), chr(arg[1])} & self.written.keys():
                    return self.written.get(chr(arg[0])) or self.written[chr(arg[1])]
        return None

    def expand(self, parsed: Any) -> Any:
        """``parsed`` with each placeholder replaced, in place, by the sample characters its
        escape matches (a class left matching none of them stands for all of them to
        runtime.redos)."""
        if self.escapes:
            for sub in _subpatterns(parsed):
                sub.data[:] = [self._expand_item(op, arg) for op, arg in sub.data]
        return parsed

    def _expand_item(self, op: Any, arg: Any) -> tuple[Any, Any]:
        if op is c.LITERAL and chr(arg) in self.escapes:
            return c.IN, self._ranges(chr(arg))
        if op is c.NOT_LITERAL and chr(arg) in self.escapes:
            return c.IN, [(c.NEGATE, None), *self._ranges(chr(arg))]
        if op is c.IN and any(o is c.LITERAL and chr(a) in self.escapes for o, a in arg):
            items: list[tuple[Any, Any]] = []
            for o, a in arg:
                if o is c.LITERAL and chr(a) in self.escapes:
                    items += self._ranges(chr(a))
                else:
                    items.append((o, a))
            return c.IN, items
        return op, arg

    def _ranges(self, placeholder: str) -> list[tuple[Any, Any]]:
        return [(c.RANGE, span) for span in _sample_ranges(self.escapes[placeholder])]


def python_form(pattern: str) -> PythonForm:
    """``pattern`` with each well-formed property escape of a known name replaced by a
    placeholder; any other is left as written, for Python's parser to refuse
    (``property_error`` says why first)."""
    if "\\p" not in pattern and "\\P" not in pattern:
        return PythonForm(pattern, {}, {})
    taken = set(pattern) | {chr(int(h, 16)) for h in _WRITTEN_OUT.findall(pattern)}
    free = (chr(p) for p in _PRIVATE_USE if chr(p) not in taken)
    out: list[str] = []
    placeholders: dict[str, str] = {}  # loose escape -> placeholder
    written: dict[str, str] = {}
    start = 0
    for match in _escapes(pattern):
        loose = _loose(match.group(0))
        placeholder = placeholders.get(loose)
        if placeholder is None and _known(match.group(0)) is not None:
            placeholder = next(free, None)  # None: the pattern holds all of them (refused)
            if placeholder is not None:
                placeholders[loose], written[placeholder] = placeholder, match.group(0)
        if placeholder is not None:
            out += [pattern[start : match.start()], placeholder]
            start = match.end()
    out.append(pattern[start:])
    escapes = {p: loose for loose, p in placeholders.items()}
    return PythonForm("".join(out), escapes, written)


def property_error(pattern: str) -> str | None:
    """Why a property escape in ``pattern`` cannot be used, or None."""
    for match in _escapes(pattern):
        name = match.group(2) if match.group(2) is not None else match.group(3)
        if name is None or not _NAME.fullmatch(name):
            return (
                f"has the property escape {match.group(0)!r}, not of the form \\p{{Name}} or"
                " \\p{Name=Value}"
            )
        if _known(match.group(0)) is None:
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


def _loose(escape: str) -> str:
    """``\\p{Script = Greek}`` as ``\\p{script=greek}``, ``\\pL`` as ``\\p{l}``: one spelling
    for each name the engines match loosely."""
    name = escape[3:-1] if escape[2:3] == "{" else escape[2:]
    return f"\\{escape[1]}{{{name.translate(_LOOSE).lower()}}}"


def _known(escape: str) -> regex.Pattern[str] | None:
    """The escape compiled by the ``regex`` module, if it is well formed and that module and
    llguidance both know its name."""
    loose = _loose(escape)
    return _compiled_loose(loose) if _NAME.fullmatch(loose[3:-1]) else None


# every name both engines know and the unknown ones seen, at about 1 KB each
@functools.lru_cache(maxsize=4096)
def _compiled_loose(escape: str) -> regex.Pattern[str] | None:
    try:
        compiled = regex.compile(escape)
    except regex.error:
        return None
    grammar = llguidance.LLMatcher.grammar_from_regex(escape)
    return None if llguidance.LLMatcher.validate_grammar(grammar) else compiled


@functools.lru_cache(maxsize=4096)
def _sample_ranges(loose: str) -> tuple[tuple[int, int], ...]:
    """The sample characters a known escape (in its loose spelling) matches, as code point
    runs."""
    compiled = _compiled_loose(loose)
    assert compiled is not None  # placeholders stand for known escapes only
    return tuple(_runs(sorted(ord(ch) for ch in SAMPLE if compiled.fullmatch(ch))))


def _runs(points: list[int]) -> Iterator[tuple[int, int]]:
    """Sorted code points as (first, last) runs of consecutive ones."""
    if not points:
        return
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


def _classes(parsed: Any) -> Iterator[list[tuple[Any, Any]]]:
    """The item lists of every character class in Python's parse."""
    for sub in _subpatterns(parsed):
        yield from (arg for op, arg in sub.data if op is c.IN)
