"""llguidance: Earley parser over a lazily built lexer; compiles in about a millisecond.

JSON schemas, regexes (Rust ``regex`` syntax) and Lark grammars all become one llguidance
grammar. ``compile`` builds a template matcher once (that is the expensive step) and each
request gets a ``deep_copy`` of it.

Its tokenizer reads a special token's text inside ordinary text as that token
(``tokenize_bytes`` ignores ``parse_special=False``), so text the grammar forces that spells
one (the literal ``"<|im_start|>"``) is forced as the special token, which its own parser
then refuses. Such constraints go to the next backend, and the mask never offers a special
token but the end of output (callproof refuses grammars that name one).
"""

from __future__ import annotations

import re
from typing import Any

import llguidance
import llguidance.hf
import torch

from runtime.backends.base import (
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    special_tokens,
)
from runtime.constraint import STRICT_JSON_OPTIONS, Constraint
from runtime.errors import BackendCannotCompile, ConstraintTooComplex, RuntimeInputError
from runtime.gbnf import to_lark
from runtime.grammar_check import LLGUIDANCE_LIMIT, limit_line
from runtime.grammar_lex import with_json_options


class LLGuidanceMatcher(GrammarMatcher):
    def __init__(self, matcher: llguidance.LLMatcher, specials: _SpecialBits):
        self._m = matcher
        self._specials = specials

    def accept_token(self, token_id: int) -> bool:
        return self._m.consume_token(token_id)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        row = bitmask[index]
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        row[self._specials.words] &= self._specials.keep

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
        return limit_line(self._m.get_error())


def _refusal(error: str, constraint: Constraint) -> RuntimeInputError:
    """Why llguidance does not compile ``constraint``. A feature it lacks: the chain's next
    backend may have it. Its fuel or size limits: a 400, never handed on, since they bound
    what a compile may cost and the others have no such bound (xgrammar took 6 s, and more
    under load, for the 999 characters of `.*` x 499 + `b` that llguidance refused in 30 ms)."""
    error = error.strip()
    if LLGUIDANCE_LIMIT.search(error):
        return ConstraintTooComplex(
            f"the {constraint.param} is too costly to compile (llguidance: {error[:300]});"
            " simplify it (fewer unbounded repetitions such as `.*` side by side)",
            param=constraint.param,
        )
    return BackendCannotCompile(f"llguidance: {error}")


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"
    exact_one_of = True  # it refuses a oneOf it cannot prove disjoint itself

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self._lltok = llguidance.hf.from_tokenizer(tokenizer)
        special = special_tokens(tokenizer)
        self._special_texts = tuple(special.values())
        # the end of the output stays in the mask when the grammar may stop there
        self._special_bits = _SpecialBits([i for i in special if i not in self._lltok.eos_tokens])

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        spelled = spelled_special_token(constraint.source, self._special_texts)
        if spelled is not None:
            raise BackendCannotCompile(
                f"llguidance: text that spells the special token {spelled} would be forced as"
                " that token, which its parser refuses"
            )
        grammar = self._grammar(constraint)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self._lltok
        )
        if is_error:  # an unsatisfiable schema never gets here: validate_constraint refuses it
            raise _refusal(messages[0], constraint)
        if messages:  # warnings name ignored schema keywords: output could break the schema
            raise BackendCannotCompile("llguidance: " + "; ".join(m.strip() for m in messages))
        template = llguidance.LLMatcher(self._lltok, grammar, log_level=0)
        if template.is_error():
            raise _refusal(template.get_error(), constraint)
        return CompiledGrammar(
            self.name,
            constraint,
            lambda: LLGuidanceMatcher(template.deep_copy(), self._special_bits),
        )

    @staticmethod
    def _grammar(constraint: Constraint) -> str:
        if constraint.is_json:
            return llguidance.LLMatcher.grammar_from_json_schema(
                constraint.source, overrides=STRICT_JSON_OPTIONS
            )
        if constraint.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(constraint.source)
        lark = with_json_options(to_lark(constraint.source), STRICT_JSON_OPTIONS)
        return llguidance.LLMatcher.grammar_from_lark(lark)


class _SpecialBits:
    """The bitmask words holding special tokens, and what keeps each word's other bits."""

    def __init__(self, tokens: list[int]):
        keep: dict[int, int] = {}
        for token in tokens:
            word = token // 32
            keep[word] = keep.get(word, -1) & ~(1 << (token % 32))
        self.words = torch.tensor(sorted(keep), dtype=torch.long)
        # int32 words: a mask with the sign bit set is written as the negative number
        self.keep = torch.tensor(
            [(keep[w] + 2**31) % 2**32 - 2**31 for w in sorted(keep)], dtype=torch.int32
        )


def spelled_special_token(source: str, special_texts: tuple[str, ...]) -> str | None:
    """The first special token whose text the constraint's source spells, read without the
    quotes, escapes and spaces that split a literal ("<|im" "_start|>", ``<\\|im_start\\|>``),
    or None. Erring towards "spells" costs only a fallback to the next backend."""
    bare = re.sub(r'[\\"\'\s]', "", source)
    return next((text for text in special_texts if text and text in bare), None)
