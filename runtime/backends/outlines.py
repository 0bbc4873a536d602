"""Outlines (outlines_core): a regex DFA indexed over the whole vocabulary.

JSON schemas become a regex (``build_regex_from_schema``), then an ``Index`` of DFA state ->
allowed tokens is built over the vocabulary. That index build is the cost: seconds on
SmolLM2's 49k tokens for a small union schema. No context-free grammars. The regex from a
schema cannot express some keywords and drops them silently; those schemas are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from outlines_core import Guide, Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema

from runtime.backends.base import CompiledGrammar, GrammarBackend, MaskReadingMatcher
from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile
from runtime.schema_keywords import BOUNDS, IGNORED_BY_ALL_BUT_LLGUIDANCE

# Accepted by build_regex_from_schema but not enforced (probed in tests/runtime/test_backends.py)
UNENFORCED = IGNORED_BY_ALL_BUT_LLGUIDANCE | BOUNDS

# No whitespace between JSON tokens: a weak model otherwise loops on whitespace.
_WHITESPACE = r"[ ]?"


class OutlinesMatcher(MaskReadingMatcher):
    def __init__(self, index: Index, vocab_size: int, stop_ids: list[int]):
        super().__init__(vocab_size, stop_ids)
        self._guide = Guide(index)

    def _accept(self, token_id: int) -> bool:
        try:
            self._guide.advance(token_id, return_tokens=False)
        except ValueError:
            return False
        return True

    def _fill(self, bitmask: torch.Tensor) -> None:
        row = bitmask[0]
        self._guide.write_mask_into(row.data_ptr(), row.numel(), row.element_size())

    def can_stop(self) -> bool:
        return self._guide.is_finished()

    def _reset(self) -> None:
        self._guide.reset()


class OutlinesBackend(GrammarBackend):
    name = "outlines"
    kinds = frozenset({"json", "tools", "regex"})
    unenforced = UNENFORCED

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self._stop_ids = [tokenizer.eos_token_id]
        self._vocabulary = _vocabulary(tokenizer)

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        if constraint.is_json:
            try:
                regex = build_regex_from_schema(constraint.source, _WHITESPACE)
            except (ValueError, TypeError) as exc:
                raise BackendCannotCompile(f"outlines: {exc}") from None
        else:
            regex = constraint.source
        try:
            index = Index(regex, self._vocabulary)
        except (ValueError, TypeError) as exc:
            raise BackendCannotCompile(f"outlines: {str(exc)[:500]}") from None
        return CompiledGrammar(
            self.name, constraint, lambda: OutlinesMatcher(index, self.vocab_size, self._stop_ids)
        )


def _vocabulary(tokenizer: Any) -> Vocabulary:
    """Token text -> ids, as Outlines builds it for transformers tokenizers (EOS apart)."""
    by_text: dict[str, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id == tokenizer.eos_token_id:
            continue
        text = tokenizer.convert_tokens_to_string([token])
        if token.startswith("\u2581") or token == "<0x20>":  # sentencepiece word start
            text = " " + text
        by_text.setdefault(text, []).append(token_id)
    return Vocabulary(tokenizer.eos_token_id, by_text)
