"""The grammar backend interface, modelled on vLLM's structured-output backends.

Two levels, because compiling is expensive and matching is per request:

* ``GrammarBackend`` (engine level): tied to one tokenizer; ``compile(constraint)`` turns a
  validated ``Constraint`` into a ``CompiledGrammar`` or raises ``BackendCannotCompile`` when
  the backend lacks a feature the constraint needs (the chain then tries the next backend).
* ``GrammarMatcher`` (request level, from ``compiled.matcher()``): walks one generation token
  by token and fills the allowed-token bitmask.

The bitmask layout is the one llguidance, xgrammar and outlines_core share: int32 words,
``(vocab + 31) // 32`` per row, bit ``i % 32`` of word ``i // 32`` set when token ``i`` is
allowed. One layout lets one torch routine apply every backend's mask.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile
from runtime.exact_json import receipt_bounded_integers
from runtime.regex_features import constraint_patterns, unenforceable_regex_feature
from runtime.schema_keywords import overlapping_one_of, refuse_keywords

_RANGE = frozenset({"minimum", "maximum"})


class GrammarMatcher(ABC):
    """One request's walk through a compiled grammar."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token; False when the grammar forbids it."""

    @abstractmethod
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        """Write the tokens allowed next into row ``index`` of an int32 bitmask."""

    @abstractmethod
    def can_stop(self) -> bool:
        """The text so far is a complete match: ending here (EOS) is allowed."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """No token but EOS can follow: the grammar is complete and closed."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the start state, so one matcher can serve several regions of a generation."""

    def limit_reached(self) -> str | None:
        """Why the matcher gave up on its own grammar (a resource limit of the library, such
        as llguidance's parser item cap), or None. A token refused for this reason is the
        grammar's fault, not a masking bug."""
        return None


class CompiledGrammar:
    """A compiled constraint, shareable across requests (the grammar cache stores these):
    the backend's compiled artefact lives in the ``new_matcher`` closure."""

    def __init__(
        self, backend: str, constraint: Constraint, new_matcher: Callable[[], GrammarMatcher]
    ):
        self.backend = backend
        self.constraint = constraint
        self._new_matcher = new_matcher

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start state; cheap, called once per request."""
        return self._new_matcher()


class GrammarBackend(ABC):
    """Compiles constraints for one tokenizer."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]] = frozenset({"json", "tools", "regex", "ebnf"})
    # JSON-schema keywords the library would ignore; schemas using them are refused
    unenforced: ClassVar[frozenset[str]] = frozenset()
    # whether oneOf means "exactly one branch" (else overlapping oneOf schemas are refused)
    exact_one_of: ClassVar[bool] = False

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compile or raise BackendCannotCompile (unsupported feature, not bad input)."""
        if constraint.kind not in self.kinds:
            raise BackendCannotCompile(f"{self.name}: no {constraint.kind} support")
        if constraint.is_json and self.unenforced:
            refuse_keywords(self.name, constraint.schema(), self.unenforced)
        if constraint.is_json and not self.exact_one_of:
            pointer = overlapping_one_of(constraint.schema())
            if pointer is not None:
                raise BackendCannotCompile(
                    f"{self.name}: enforces oneOf as anyOf, and the branches of {pointer} may"
                    " overlap"
                )
        for pattern in constraint_patterns(constraint):
            feature = unenforceable_regex_feature(pattern)
            if feature is not None:  # two backends dropped lookarounds silently, one crashed
                raise BackendCannotCompile(f"{self.name}: {pattern!r} uses {feature}")
        compiled = self._compile(self._decoded(constraint))
        compiled.constraint = constraint  # the request's, as the grammar cache keys it
        return compiled

    def _decoded(self, constraint: Constraint) -> Constraint:
        """What this backend compiles for ``constraint``: integers held within what a receipt
        can record, by a backend that enforces minimum and maximum (the others would refuse
        the bounds, or ignore them)."""
        if not constraint.is_json or _RANGE & self.unenforced:
            return constraint
        bounded = receipt_bounded_integers(constraint.schema())
        return Constraint.json_schema(bounded, kind=constraint.kind)

    @abstractmethod
    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compile a constraint of one of ``kinds``."""


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(vocab_size: int, batch: int = 1) -> torch.Tensor:
    """All-allowed int32 bitmask rows for ``vocab_size`` tokens."""
    return torch.full((batch, bitmask_words(vocab_size)), -1, dtype=torch.int32)


_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


def bitmask_to_bool(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack one bitmask row into a bool tensor of ``vocab_size`` (True = allowed)."""
    bits = (bitmask_row.unsqueeze(-1) >> _BIT_SHIFTS) & 1
    return bits.view(-1)[:vocab_size].bool()


def set_token_bit(bitmask_row: torch.Tensor, token_id: int, allowed: bool) -> None:
    """Allow or forbid one token in a bitmask row (used to gate EOS and forced tags)."""
    word, bit = divmod(token_id, 32)
    value = int(bitmask_row[word])
    value = value | (1 << bit) if allowed else value & ~(1 << bit)
    if value >= 1 << 31:  # back to a signed int32
        value -= 1 << 32
    bitmask_row[word] = value


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of the loaded tokenizer's serialised vocabulary and rules: part of the grammar
    cache's key, so two tokenizers with one name but different vocabularies never share a
    compiled grammar. (The manifest binds the tokenizer files' digest instead, from
    runtime.model_store, which an auditor can recompute from the model directory.)"""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        payload = backend.to_str().encode()
    else:  # a slow tokenizer: its vocabulary is what grammars depend on
        payload = repr(sorted(tokenizer.get_vocab().items())).encode()
    return hashlib.sha256(payload).hexdigest()


def special_tokens(tokenizer: Any) -> dict[int, str]:
    """The tokenizer's special tokens by id: the chat template's controls, which a user's text
    must not be read as, and which a grammar's masks must never offer."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return {i: t.content for i, t in added.items() if t.special}


def allows_only(bitmask_row: torch.Tensor, token_ids: list[int]) -> bool:
    """True when the row allows no token outside ``token_ids`` (e.g. only EOS)."""
    rest = bitmask_row.clone()
    for token in token_ids:
        set_token_bit(rest, token, False)
    return not bool(rest.any())


class MaskReadingMatcher(GrammarMatcher):
    """For libraries that cannot say "only EOS may follow": read it off the mask of the
    current state, computed once per state and reused by the next fill."""

    def __init__(self, vocab_size: int, stop_ids: list[int]):
        self._stop_ids = stop_ids
        self._state_mask = allocate_bitmask(vocab_size)
        self._state_mask_valid = False

    @abstractmethod
    def _accept(self, token_id: int) -> bool: ...

    @abstractmethod
    def _fill(self, bitmask: torch.Tensor) -> None:
        """Write the current state's mask into row 0 of ``bitmask``."""

    @abstractmethod
    def _reset(self) -> None: ...

    def accept_token(self, token_id: int) -> bool:
        self._state_mask_valid = False
        return self._accept(token_id)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        bitmask[index].copy_(self._current_mask())

    def is_terminated(self) -> bool:
        return self.can_stop() and allows_only(self._current_mask(), self._stop_ids)

    def reset(self) -> None:
        self._state_mask_valid = False
        self._reset()

    def _current_mask(self) -> torch.Tensor:
        if not self._state_mask_valid:
            self._fill(self._state_mask)
            self._state_mask_valid = True
        return self._state_mask[0]
