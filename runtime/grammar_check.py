"""Model output checked against its ``grammar`` again, byte by byte, before it is receipted.

A JSON schema's output is validated again with jsonschema-rs and a regex's matched again with
Python's engine; a grammar had no second reading, so on vLLM, whose server applies it, a
receipt called output valid on the server's word alone (a server that ignored the grammar,
after an upgrade or with another backend, went unnoticed). llguidance reads the grammar here
as the gateway's limits do (runtime/constraint.py), through a tokenizer of one token per
byte: no model is needed, and 17 KB of output is checked in about 7 ms.
"""

from __future__ import annotations

import llguidance

from runtime.bounded_cache import size_bounded
from runtime.constraint import to_lark


class _ByteTokenizer:
    """One token per byte, and an end token: what llguidance needs to match text."""

    eos_token_id = 256
    bos_token_id = None
    tokens = (*(bytes([b]) for b in range(256)), b"<|end|>")
    special_token_ids = (256,)

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_BYTES = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))


@size_bounded(len, max_entries=256, max_bytes=16 << 20)  # grammars within max_grammar_bytes
def _matcher(grammar: str) -> llguidance.LLMatcher:
    """A matcher at the grammar's start, built once per grammar (each check takes a copy)."""
    return llguidance.LLMatcher(
        _BYTES, llguidance.LLMatcher.grammar_from_lark(to_lark(grammar)), log_level=0
    )


def grammar_mismatch(grammar: str, text: str, *, cut: bool = False) -> str | None:
    """Why ``text`` is not a sentence of ``grammar`` (when ``cut``, by max_tokens or a stop
    string: not the start of one), or None when it is."""
    matcher = _matcher(grammar).deep_copy()
    if matcher.is_error():  # the grammar passed the same reader's checks when it came in
        return f"output could not be checked against the grammar ({_first_line(matcher)})"
    data = text.encode()
    read = matcher.try_consume_tokens(list(data))
    if read < len(data):
        return (
            f"output leaves the grammar at byte {read} of {len(data)} (a backend that does not"
            " enforce all of it, or a server that ignored it)"
        )
    if not cut and not matcher.is_accepting():
        return f"output ends ({len(data)} bytes) before the grammar allows it to"
    return None


def _first_line(matcher: llguidance.LLMatcher) -> str:
    return matcher.get_error().splitlines()[0][:300]


__all__ = ["grammar_mismatch"]
