"""Unicode property escapes (``\\p{L}``, ``\\P{Nd}``, ``\\p{Script=Greek}``) in constraint
regexes, which Python's ``re`` does not have.

JSON Schema patterns are ECMA-262 regexes, where ``\\p{L}`` is the usual way to say "a letter
in any script", and llguidance (Rust's regex syntax) enforces them. Python's ``re``, which
reads every regex here for its limits (runtime.limits), refuses them. So a pattern holding
them is checked in two parts: the ``regex`` module (what the output check runs) validates the
property names, and Python's parser reads a stand-in where each escape is a class of the
sample characters it matches (runtime.redos compares character sets on that sample), or any
character when it matches none of them.
"""

from __future__ import annotations

import functools
import re

import regex

from runtime.redos import SAMPLE

# \p or \P, then {name} or a one-letter name (Rust and the regex module read \pL as \p{L})
_ESCAPE = re.compile(r"\\([pP])(\{[^{}\\]{1,64}\}|[A-Za-z])")
_ANY = r"\s\S"


def has_property_escape(pattern: str) -> bool:
    """Whether ``pattern`` writes a ``\\p`` or ``\\P`` escape (cheap; escapes are not
    resolved, so ``\\\\p{L}`` counts too, which only costs the full check)."""
    return "\\p" in pattern or "\\P" in pattern


def property_error(pattern: str) -> str | None:
    """Why the ``regex`` module does not compile ``pattern`` (an unknown property name), or
    None."""
    try:
        regex.compile(pattern)
    except (regex.error, OverflowError) as exc:
        return str(exc)
    return None


def python_form(pattern: str) -> str:
    """``pattern`` with each property escape replaced by a class Python's parser reads: the
    sample characters it matches. An escape the ``regex`` module cannot read (an unknown name)
    is left as it is, for Python's parser to refuse."""
    if not has_property_escape(pattern):
        return pattern
    out: list[str] = []
    i, start, in_class = 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            match = _ESCAPE.match(pattern, i)
            if match is None:
                i += 2
                continue
            chars = _sample_matches(match.group(0))
            if chars is not None:
                out.append(pattern[start:i])
                out.append(chars if in_class else f"[{chars}]")
                start = match.end()
            i = match.end()
            continue
        if not in_class and ch == "[":
            in_class = True
            i += 1 + pattern.startswith("^", i + 1)
            i += pattern.startswith("]", i)  # a "]" first is the character
            continue
        if in_class and ch == "]":
            in_class = False
        i += 1
    out.append(pattern[start:])
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _sample_matches(escape: str) -> str | None:
    """The body of a character class holding the sample characters ``escape`` matches (any
    character when none: a script the sample lacks must still overlap what it may match), or
    None when the ``regex`` module does not know the property."""
    try:
        compiled = regex.compile(escape)
    except regex.error:
        return None
    chars = sorted(ch for ch in SAMPLE if compiled.fullmatch(ch))
    return "".join(re.escape(ch) for ch in chars) if chars else _ANY
