"""xgrammar: pushdown automaton with a precomputed adaptive token mask cache.

Lark grammars compile with ``compile_lark``, GBNF with ``compile_grammar`` (its own dialect).
Its JSON-schema converter silently ignores keywords it does not implement (``not``,
``uniqueItems``, ...), which would let through output that breaks the schema; such schemas
are refused (``unenforced``, checked by GrammarBackend.compile) so the chain moves on rather
than enforce less than was asked. What it drops only in some combinations, or reads in
another regex dialect, it says in a log line on stderr and compiles anyway; `_dropped` finds
those cases first (runtime/xgrammar_gaps.py, shared with the vLLM engine).
"""

from __future__ import annotations

from typing import Any

import torch
import xgrammar as xgr

from runtime.backends.base import (
    CompiledGrammar,
    GrammarBackend,
    MaskReadingMatcher,
)
from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile
from runtime.gbnf import is_gbnf
from runtime.schema_walk import schema_nodes
from runtime.xgrammar_gaps import LOG_LOCATION, UNENFORCED, weakened, xgrammar_misreading


class XGrammarMatcher(MaskReadingMatcher):
    """xgrammar terminates only after the stop token itself, hence MaskReadingMatcher."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int, stop_ids: list[int]):
        super().__init__(vocab_size, stop_ids)
        self._m = xgr.GrammarMatcher(compiled)

    def _accept(self, token_id: int) -> bool:
        return self._m.accept_token(token_id)

    def _fill(self, bitmask: torch.Tensor) -> None:
        self._m.fill_next_token_bitmask(bitmask, 0)

    def can_stop(self) -> bool:
        return self._m.is_completed()

    def _reset(self) -> None:
        self._m.reset()


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"
    unenforced = UNENFORCED

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self._stop_ids = [tokenizer.eos_token_id]
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_ids
        )
        # our own GrammarCache keys and bounds compiled grammars; xgrammar's would duplicate it
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        dropped = _dropped(constraint)
        if dropped is not None:
            raise BackendCannotCompile(f"xgrammar: {dropped}")
        try:
            compiled = self._xgr_compile(constraint)
        except (RuntimeError, ValueError) as exc:
            raise BackendCannotCompile(f"xgrammar: {_message(exc)}") from None
        return CompiledGrammar(
            self.name,
            constraint,
            lambda: XGrammarMatcher(compiled, self.vocab_size, self._stop_ids),
        )

    def _xgr_compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        if constraint.is_json:
            return self._compiler.compile_json_schema(
                constraint.source, any_whitespace=False, separators=(",", ":"), strict_mode=True
            )
        if constraint.kind == "regex":
            return self._compiler.compile_regex(constraint.source)
        if is_gbnf(constraint.source):  # xgrammar's own EBNF dialect is GBNF
            return self._compiler.compile_grammar(constraint.source)
        return self._compiler.compile_lark(constraint.source)


def _dropped(constraint: Constraint) -> str | None:
    """What xgrammar would compile into a weaker constraint than Python's reading of it (its
    warnings, probed with this version), or None."""
    if constraint.kind == "regex":
        return xgrammar_misreading(constraint.source)
    if not constraint.is_json:
        return None
    for pointer, node in schema_nodes(constraint.schema()):
        for _, why in weakened(node, pointer):
            return why
    return None


def _message(exc: Exception) -> str:
    """The reason alone: xgrammar prefixes its C++ log location ("[08:44:51]
    /project/cpp/regex_converter.cc:83: "), which says nothing to the client."""
    return LOG_LOCATION.sub("", str(exc).strip(), count=1)[:500]
