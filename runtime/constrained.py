"""Constrained decoding for transformers: grammar-masked logits, and the post-hoc fallback.

``processor_of(compiled, tokenizer)`` wraps a grammar the cache compiled (runtime/grammar_cache.py)
in a ``ConstrainedLogitsProcessor`` for one generation: the embedded engine calls it from its
decode loop, and it fits ``model.generate(logits_processor=[...])`` as well. A processor holds
one generation's state: make a new one per generation (``compiled.matcher()`` is cheap; the
compile is cached).

Masking is one bitmask fill by the backend plus one vectorised torch ``masked_fill_``: no
Python loop over the vocabulary. EOS is allowed only where the grammar may stop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import LogitsProcessor

from runtime.backends.base import (
    CompiledGrammar,
    GrammarMatcher,
    allocate_bitmask,
    bitmask_to_bool,
    set_token_bit,
)
from runtime.errors import (
    ConstraintTooComplex,
    ConstraintUnsatisfiable,
    EngineFault,
    StructuredOutputInvalid,
)
from runtime.exact_json import EXACT_JSON
from runtime.schema_check import validate
from runtime.thinking import Enforcement, EnforcementMachine, Phase


class GrammarViolation(EngineFault):
    """A token reached the matcher that its own mask forbade: a backend bug. Generation stops
    (fail closed) rather than emit output the constraint does not admit."""


class ConstrainedLogitsProcessor(LogitsProcessor):
    """Masks logits to what the grammar allows next, for a batch of one sequence.

    With an ``Enforcement`` the mask applies only where the state machine says so (thinking
    regions and text outside tool-call tags stay free).
    """

    def __init__(
        self,
        matcher: GrammarMatcher,
        tokenizer: Any,
        *,
        eos_token_ids: Iterable[int] | None = None,
        enforcement: Enforcement | None = None,
        param: str | None = None,
    ):
        self.matcher = matcher
        self._param = param  # the request field the grammar came from, for errors
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        ids = tokenizer.eos_token_id if eos_token_ids is None else eos_token_ids
        self.eos_token_ids = [ids] if isinstance(ids, int) else list(ids)
        self.machine = EnforcementMachine(enforcement or Enforcement())
        self._bitmask = allocate_bitmask(self.vocab_size)
        self._started = False
        self._end_tag_token: int | None = None  # triggered: the end tag's first token, if offered

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != 1:
            raise ValueError("ConstrainedLogitsProcessor serves one sequence (batch size 1)")
        if self._started:
            self._advance(int(input_ids[0, -1]))
        self._started = True
        return self._mask(scores)

    def complete_after(self, token: int) -> bool:
        """Whether the constrained output is finished once `token`, the last one sampled, is
        read: nothing but end-of-sequence may follow. An output the token limit ends there is
        complete, as if the model had gone on to the end-of-sequence token it was forced to.
        The last call: the processor is spent after it."""
        self._advance(token)
        return self.machine.phase is Phase.DONE

    # -- advancing -------------------------------------------------------------------------

    def _advance(self, token: int) -> None:
        if self.machine.phase is Phase.ENFORCED:
            if self.matcher.accept_token(token):
                if self.matcher.is_terminated():
                    self.machine.grammar_complete()
                return
            if token != self._end_tag_token:
                self._raise_if_limit()
                raise GrammarViolation(f"token {token} rejected by the grammar it was masked to")
            self.machine.grammar_complete()  # the model chose to close the tool call here
        elif self.machine.phase is Phase.DONE:
            return  # only EOS was allowed; generation ends with it
        rest = self.machine.feed(self.tokenizer.decode([token]))
        if rest is not None:  # a tag switched the grammar on mid-token
            self.matcher.reset()
            self._feed_grammar(rest.lstrip())

    def _feed_grammar(self, text: str) -> None:
        """Text after a start tag inside the same token belongs to the grammar."""
        for token in self.tokenizer.encode(text, add_special_tokens=False) if text else ():
            if not self.matcher.accept_token(token):
                raise GrammarViolation(f"text {text!r} after the start tag breaks the grammar")
        if self.matcher.is_terminated():
            self.machine.grammar_complete()

    # -- masking ---------------------------------------------------------------------------

    def _mask(self, scores: torch.FloatTensor) -> torch.FloatTensor:
        phase = self.machine.phase
        self._end_tag_token = None
        if phase is Phase.FREE:
            return scores
        if phase is Phase.THINKING:
            if self.machine.config.mode == "always":  # the constrained part must still come
                scores[:, self.eos_token_ids] = float("-inf")
            return scores
        row = self._bitmask[0]
        if phase is Phase.ENFORCED:
            self.matcher.fill_next_token_bitmask(self._bitmask, 0)
            may_stop = self.matcher.can_stop()
            for eos in self.eos_token_ids:
                set_token_bit(row, eos, may_stop and self.machine.config.mode == "always")
            if may_stop and self.machine.config.mode == "triggered":
                self._end_tag_token = self._first_token(self.machine.config.trigger_end)
                set_token_bit(row, self._end_tag_token, True)
        else:
            row.zero_()
            if phase in (Phase.OPENING, Phase.CLOSING):  # force the tag, a token at a time
                set_token_bit(row, self._first_token(self.machine.pending_forced_tag()), True)
            else:  # DONE
                for eos in self.eos_token_ids:
                    set_token_bit(row, eos, True)
        allowed = bitmask_to_bool(row, self.vocab_size)
        if not allowed.any():  # sampling from nothing: NaN probabilities, or token 0 picked
            self._raise_if_limit()  # the mask came out empty because the backend gave up
            raise ConstraintUnsatisfiable(
                "the constraint allows no next token: it admits no output this model can write"
                " (a schema or grammar with no way to finish, or one asking for a special token"
                " such as an end-of-turn marker)",
                param=self._param,
            )
        scores[:, : self.vocab_size].masked_fill_(~allowed, float("-inf"))
        scores[:, self.vocab_size :] = float("-inf")  # padding rows of the embedding
        return scores

    def _raise_if_limit(self) -> None:
        """ConstraintTooComplex when the matcher stopped at one of its backend's resource
        limits (llguidance's items per step), which a smaller constraint stays under."""
        if limit := self.matcher.limit_reached():
            raise ConstraintTooComplex(
                f"the constraint went over its grammar backend's limits while decoding"
                f" ({limit}); make it smaller (fewer or shorter repetitions)",
                param=self._param,
            )

    def _first_token(self, text: str) -> int:
        return self.tokenizer.encode(text, add_special_tokens=False)[0]


def processor_of(
    compiled: CompiledGrammar,
    tokenizer: Any,
    *,
    enforcement: Enforcement | None = None,
    eos_token_ids: Iterable[int] | None = None,
) -> ConstrainedLogitsProcessor:
    """A logits processor for one request on a grammar compiled already (a fresh matcher:
    the compiled grammar is shared, the matcher's state is the request's)."""
    return ConstrainedLogitsProcessor(
        compiled.matcher(),
        tokenizer,
        eos_token_ids=eos_token_ids,
        enforcement=enforcement,
        param=compiled.constraint.param,
    )


# -- the last resort: validate, fold the error into the prompt, retry ----------------------


def post_hoc_retry_json(
    generate_fn: Callable[[str], str],
    prompt: str,
    schema: dict[str, Any],
    max_retries: int = 2,
    *,
    param: str,
) -> Any:
    """For constraints no backend can compile: generate freely, check, re-prompt.

    Returns the JSON value of the first output that validates; when none does, raises
    StructuredOutputInvalid with the schema, the last raw output and the failing JSON pointer,
    naming ``param``, the request field the schema came from.
    """
    attempt_prompt = prompt
    error: StructuredOutputInvalid | None = None
    for _ in range(max_retries + 1):
        raw = generate_fn(attempt_prompt)
        try:
            parsed = _first_json_value(raw)
        except ValueError as exc:
            error = StructuredOutputInvalid(
                f"the output is not JSON: {exc}",
                schema=schema,
                raw_output=raw,
                pointer="",
                param=param,
            )
        else:
            try:  # the validator plan.parse checks the answer with again: the same verdict
                validate(parsed, schema, raw, param=param)
            except StructuredOutputInvalid as failure:
                error = failure
            else:
                return parsed
        attempt_prompt = (
            f"{prompt}\n\nYour previous answer was:\n{raw}\n{error.message}\nAnswer again "
            f"with only a JSON value that matches this JSON schema:\n{json.dumps(schema)}"
        )
    assert error is not None, "max_retries must not be negative"
    raise error


def _first_json_value(text: str) -> Any:
    """The first JSON object or array in the text (models wrap JSON in prose or fences)."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON object or array found")
    try:  # numbers a receipt cannot hold exactly fail here too, and become a retry reason
        return EXACT_JSON.raw_decode(text, min(starts))[0]
    except json.JSONDecodeError as exc:
        raise ValueError(exc.msg) from None
