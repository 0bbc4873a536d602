"""Grammar output read again after decoding, where the backend that enforced the grammar
was llguidance (the embedded engine's, or the vLLM server's guidance backend): a backend
that stops early must not yield a receipt that calls its output valid. vLLM's guidance
backend, past llguidance's item limit in the middle of an output, ends it there with
finish_reason "stop".

The reading is llguidance's parser fed the output a byte at a time, through a tokenizer of
the 256 bytes: a grammar describes text, not one model's vocabulary. It is the enforcing
backend's own reading, and no other: xgrammar reads some grammars character by character
where llguidance lexes (``[a-z]+ "ing"`` admits "singing" in xgrammar and not in
llguidance), so output xgrammar rightly wrote would be refused; its grammar output is not
read again (docs/api.md). A grammar is compiled for the check once and copied per output.

A grammar whose rules carry llguidance's attributes (``name[stop="..."]``,
``[max_tokens=N]``, ``[lazy]``) is not read again: a hidden stop string is missing from the
text, and a token count is the model's tokens, not bytes.
"""

from __future__ import annotations

import re
from typing import Any

import llguidance

from runtime.bounded_cache import size_bounded
from runtime.errors import ConstraintTooComplex
from runtime.gbnf import to_lark

GRAMMAR_READERS = frozenset({"llguidance", "guidance"})
"""The backends (embedded, and the vLLM server's) whose grammar output is read again."""

# A rule with attributes: its name, then "[" (Lark writes a rule's template arguments in {}).
_RULE_ATTRIBUTES = re.compile(r"^\s*[?!]?[A-Za-z_]\w*\s*\[", re.MULTILINE)
# llguidance's resource limits, as its errors word them ("Too many items (limit 50000)",
# "Current row has 2002 items; max is 2000", "lexer fuel exhausted"): bounds on what a
# compile or a step may cost, not a feature it lacks.
LLGUIDANCE_LIMIT = re.compile(
    r"too many|too big|too large|\bmax is\b|\bfuel\b|\blimits?\b", re.IGNORECASE
)


class _ByteVocabulary:
    """The 256 bytes as tokens 0-255, and an end-of-sequence token (256) no text holds."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


_tokenizer: Any = None


def _bytes_tokenizer() -> Any:
    global _tokenizer
    if _tokenizer is None:  # llguidance's tables for it: about 2 ms, once
        _tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary()))
    return _tokenizer


def grammar_mismatch(grammar: str, text: str, *, cut: bool = False) -> str | None:
    """Why ``text`` is not output of ``grammar`` (Lark or GBNF), or None (also when the
    grammar cannot be checked this way). ``cut``: max_tokens or a stop string ended the
    output, so it need only be a beginning of the grammar's output. A grammar too large
    for the check's parser raises ConstraintTooComplex: its output cannot be vouched for."""
    compiled = _compiled(grammar)
    if compiled is None:
        return None
    matcher = compiled.deep_copy()
    data = text.encode()
    read = matcher.try_consume_tokens(list(data))
    if matcher.is_error():
        _raise_if_limit(matcher.get_error())
    if read < len(data):
        at = len(data[:read].decode(errors="ignore"))
        return (
            f"output does not match the grammar from character {at} ({text[at : at + 20]!r}),"
            " a backend that does not enforce all of it"
        )
    if not cut and not matcher.is_accepting():
        return (
            "output ends before the grammar allows it to (a backend that stopped early, or"
            " does not enforce all of it)"
        )
    return None


def limit_line(error: str) -> str | None:
    """The first line of llguidance's ``error`` (at most 300 characters) when it names one
    of its resource limits, else None."""
    first = error.strip().split("\n", 1)[0]
    return first[:300] if LLGUIDANCE_LIMIT.search(first) else None


def _raise_if_limit(error: str) -> None:
    if (limit := limit_line(error)) is not None:
        raise ConstraintTooComplex(
            f"the grammar is too costly to check its output against (llguidance: {limit});"
            " make it smaller (fewer repetitions side by side)",
            param="grammar",
        )


# A compiled grammar holds its parser's tables, several times its text: few are kept.
@size_bounded(len, max_entries=64, max_bytes=16 << 20)
def _compiled(grammar: str) -> Any:
    """The check's matcher for ``grammar`` before any byte, or None when it is not checked:
    attributes on its rules, or a grammar llguidance does not compile (which only another
    backend enforces)."""
    try:
        lark = to_lark(grammar)
    except ValueError:
        return None
    if _RULE_ATTRIBUTES.search(lark):
        return None
    matcher = llguidance.LLMatcher(
        _bytes_tokenizer(), llguidance.LLMatcher.grammar_from_lark(lark), log_level=0
    )
    if matcher.is_error():
        _raise_if_limit(matcher.get_error())
        return None
    return matcher


__all__ = ["GRAMMAR_READERS", "LLGUIDANCE_LIMIT", "grammar_mismatch", "limit_line"]
