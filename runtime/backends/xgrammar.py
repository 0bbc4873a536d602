"""xgrammar: pushdown automaton with a precomputed adaptive token mask cache.

Lark grammars compile with ``compile_lark``, GBNF with ``compile_grammar`` (its own dialect).
Its JSON-schema converter silently ignores keywords it does not implement (``not``,
``uniqueItems``, ...), which would let through output that breaks the schema; such schemas
are refused (``unenforced``, checked by GrammarBackend.compile) so the chain moves on rather
than enforce less than was asked. What it drops only in some combinations, or reads in
another regex dialect, it says in a log line on stderr and compiles anyway; `_dropped` finds
those cases first.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import xgrammar as xgr

from runtime.backends.base import (
    CompiledGrammar,
    GrammarBackend,
    MaskReadingMatcher,
)
from runtime.backends.schema_keywords import IGNORED_BY_ALL_BUT_LLGUIDANCE
from runtime.constraint import Constraint, is_gbnf
from runtime.errors import BackendCannotCompile
from runtime.regex_features import constraint_patterns
from runtime.schema_walk import schema_nodes

_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")

# Keywords the converter accepts but does not enforce (probed in tests/runtime/test_backends.py).
UNENFORCED = IGNORED_BY_ALL_BUT_LLGUIDANCE | frozenset(
    {
        "allOf",
        "patternProperties",
    }
)


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


# Escapes Python's `re` reads as anchors, octal or named characters (and the `regex` module
# and llguidance \p{..} as a Unicode property) and xgrammar's regex converter as the letter or
# digit itself ("Escape sequence '\Z' is not recognized. The character itself will be
# matched"); any other escape pair is skipped whole.
_ESCAPE = re.compile(r"\\(?:([AZzNpP]|0[0-7]|[1-9])|.)", re.DOTALL)


def _dropped(constraint: Constraint) -> str | None:
    """What xgrammar would compile into a weaker constraint than Python's reading of it (its
    warnings, probed with this version), or None."""
    for pattern in constraint_patterns(constraint):
        for match in _ESCAPE.finditer(pattern):
            if match.group(1):
                return f"reads the escape \\{match.group(1)} in {pattern!r} literally"
    if not constraint.is_json:
        return None
    for pointer, node in schema_nodes(constraint.schema()):
        if "multipleOf" in node and not _integer_multiple(node):
            return (
                f"ignores multipleOf at {pointer or '/'} (enforced on whole steps of integers"
                " with no minimum or maximum beside it)"
            )
        if {"pattern", "format"} & node.keys() and {"minLength", "maxLength"} & node.keys():
            return f"ignores minLength/maxLength beside a pattern or format at {pointer or '/'}"
    return None


_RANGE = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def _integer_multiple(node: dict[str, Any]) -> bool:
    """Whether xgrammar enforces this node's multipleOf: a whole step on an integer with no
    range beside it ("range + multipleOf combination not yet supported")."""
    types = node.get("type")
    step = node["multipleOf"]
    return (
        (
            types == "integer"
            or (isinstance(types, list) and "integer" in types and "number" not in types)
        )
        and isinstance(step, int | float)
        and not isinstance(step, bool)
        and float(step).is_integer()
        and not _RANGE & node.keys()
    )


def _message(exc: Exception) -> str:
    """The reason alone: xgrammar prefixes its C++ log location ("[08:44:51]
    /project/cpp/regex_converter.cc:83: "), which says nothing to the client."""
    return _LOG_PREFIX.sub("", str(exc).strip(), count=1)[:500]
