"""lm-format-enforcer: character-level parsers walked over a token prefix tree.

No compile step worth the name (the schema parser is built per request), but the mask is
computed in Python per token, which makes it the slowest mask here. JSON schema and regex
(interegular syntax); no context-free grammars.
"""

from __future__ import annotations

from typing import Any

import torch
from lmformatenforcer import (
    CharacterLevelParser,
    JsonSchemaParser,
    RegexParser,
    TokenEnforcer,
    TokenEnforcerTokenizerData,
)

from runtime.backends.base import CompiledGrammar, GrammarBackend, MaskReadingMatcher
from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile
from runtime.schema_keywords import BOUNDS, IGNORED_BY_ALL_BUT_LLGUIDANCE

UNENFORCED = (
    IGNORED_BY_ALL_BUT_LLGUIDANCE
    | BOUNDS
    | {
        "format",
        "patternProperties",
        "allOf",
        "prefixItems",
    }
)


class LMFEMatcher(MaskReadingMatcher):
    def __init__(self, data: Any, parser: CharacterLevelParser, vocab_size: int, eos: int):
        super().__init__(vocab_size, [eos])
        self._data = data
        self._parser = parser
        self._eos = eos
        self._reset()

    def _reset(self) -> None:
        self._enforcer = TokenEnforcer(self._data, self._parser)
        self._tokens: list[int] = []

    def _accept(self, token_id: int) -> bool:
        allowed = self._enforcer.get_allowed_tokens(self._tokens)
        if not allowed.is_token_allowed(token_id):
            return False
        self._tokens.append(token_id)
        return True

    def _fill(self, bitmask: torch.Tensor) -> None:
        bitmask[0].copy_(self._enforcer.get_allowed_tokens(self._tokens).allowed_tokens)

    def can_stop(self) -> bool:
        return bool(self._enforcer.get_allowed_tokens(self._tokens).is_token_allowed(self._eos))


class LMFormatEnforcerBackend(GrammarBackend):
    name = "lm-format-enforcer"
    kinds = frozenset({"json", "tools", "regex"})
    unenforced = UNENFORCED

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self._data = _tokenizer_data(tokenizer, self.vocab_size)

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        try:
            if constraint.is_json:
                parser: CharacterLevelParser = JsonSchemaParser(constraint.schema())
            else:
                parser = RegexParser(constraint.source)
        # Its parsers raise a bare Exception on unsupported input.
        except Exception as exc:  # noqa: BLE001
            raise BackendCannotCompile(f"lm-format-enforcer: {str(exc)[:500]}") from None
        eos = self.tokenizer.eos_token_id
        return CompiledGrammar(
            self.name, constraint, lambda: LMFEMatcher(self._data, parser, self.vocab_size, eos)
        )


def _tokenizer_data(tokenizer: Any, vocab_size: int) -> TokenEnforcerTokenizerData:
    """lmformatenforcer's transformers integration, which fails to import on transformers 5:
    each token's text, and whether it starts a word (decoded after "0" it gains a space)."""
    zero = tokenizer.encode("0", add_special_tokens=False)[-1]
    special = set(tokenizer.all_special_ids)
    regular = []
    for token in range(vocab_size):
        if token in special:
            continue
        after_zero = tokenizer.decode([zero, token])[1:]
        regular.append((token, after_zero, len(after_zero) > len(tokenizer.decode([token]))))

    def decode(tokens: list[int]) -> str:
        return tokenizer.decode(tokens).rstrip("\ufffd")

    return TokenEnforcerTokenizerData(regular, decode, tokenizer.eos_token_id, True, vocab_size)
