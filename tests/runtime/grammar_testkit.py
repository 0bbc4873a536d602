"""Shared by the grammar tests: the bundled SmolLM2 tokenizer (loaded once) and walking text
through a matcher token by token, as a model would emit it."""

from __future__ import annotations

import functools
from typing import Any

from runtime.backends.base import CompiledGrammar, GrammarMatcher
from runtime.backends.registry import BackendChain
from runtime.constraint import Constraint
from runtime.grammar_cache import GrammarCache


@functools.cache
def smol_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from runtime.model_store import bundled_model_dir

    return AutoTokenizer.from_pretrained(bundled_model_dir())


def matches(matcher: GrammarMatcher, text: str) -> bool:
    """Whether the matcher accepts ``text`` as a complete output."""
    for token in smol_tokenizer().encode(text, add_special_tokens=False):
        if not matcher.accept_token(token):
            return False
    return matcher.can_stop()


@functools.cache
def smol_grammars() -> GrammarCache:
    """The grammar cache an embedded engine on the bundled model builds (default order)."""
    return GrammarCache(BackendChain(smol_tokenizer()))


def compiled(constraint: Constraint) -> CompiledGrammar:
    return smol_grammars().get(constraint)
