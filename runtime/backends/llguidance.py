"""llguidance: Earley parser over a lazily built lexer; compiles in about a millisecond.

JSON schemas, regexes (Rust ``regex`` syntax) and Lark grammars all become one llguidance
grammar. ``compile`` builds a template matcher once (that is the expensive step) and each
request gets a ``deep_copy`` of it.
"""

from __future__ import annotations

import re
from typing import Any

import llguidance
import llguidance.hf
import torch

from runtime.backends.base import CompiledGrammar, GrammarBackend, GrammarMatcher
from runtime.constraint import STRICT_JSON_OPTIONS, Constraint, to_lark
from runtime.errors import BackendCannotCompile

_RESOURCE_LIMIT = re.compile(r"too many|\blimit\b", re.IGNORECASE)


class LLGuidanceMatcher(GrammarMatcher):
    def __init__(self, matcher: llguidance.LLMatcher):
        self._m = matcher

    def accept_token(self, token_id: int) -> bool:
        return self._m.consume_token(token_id)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        row = bitmask[index]
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def can_stop(self) -> bool:
        return self._m.is_accepting()

    def is_terminated(self) -> bool:
        return self._m.is_stopped()

    def reset(self) -> None:
        self._m.reset()

    def limit_reached(self) -> str | None:
        """llguidance's error, when it is one of its resource limits ("Too many items (limit
        50000)", "too many expressions constructed"). Refusing a token sets an error too
        ("token ... doesn't satisfy the grammar"): that one is a masking bug, not a limit."""
        if not self._m.is_error():
            return None
        error = self._m.get_error().splitlines()[0]
        return error[:300] if _RESOURCE_LIMIT.search(error) else None


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"
    exact_one_of = True  # it refuses a oneOf it cannot prove disjoint itself

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self._lltok = llguidance.hf.from_tokenizer(tokenizer)

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        grammar = self._grammar(constraint)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self._lltok
        )
        if is_error:  # an unsatisfiable schema never gets here: validate_constraint refuses it
            raise BackendCannotCompile(f"llguidance: {messages[0].strip()}")
        if messages:  # warnings name ignored schema keywords: output could break the schema
            raise BackendCannotCompile("llguidance: " + "; ".join(m.strip() for m in messages))
        template = llguidance.LLMatcher(self._lltok, grammar, log_level=0)
        if template.is_error():
            raise BackendCannotCompile(f"llguidance: {template.get_error()}")
        return CompiledGrammar(
            self.name, constraint, lambda: LLGuidanceMatcher(template.deep_copy())
        )

    @staticmethod
    def _grammar(constraint: Constraint) -> str:
        if constraint.is_json:
            return llguidance.LLMatcher.grammar_from_json_schema(
                constraint.source, overrides=STRICT_JSON_OPTIONS
            )
        if constraint.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(constraint.source)
        return llguidance.LLMatcher.grammar_from_lark(to_lark(constraint.source))
