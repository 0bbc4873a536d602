"""The vLLM engine: an HTTP client of a vLLM OpenAI-compatible server doing the decoding.

vLLM enforces the constraint itself (its structured outputs, backend xgrammar or guidance), so
this engine only translates: the plan's rendered messages, the one constraint and the sampling
parameters become a /v1/chat/completions body (runtime.engines.vllm_request); the answer (or
its SSE stream) becomes a Generation. Tools are already rendered into the messages, so vLLM's
own ``tools`` field is not used: the tool union is an ordinary JSON schema here, which holds
every tool to its schema whether or not the client marked it ``strict``. Schema keywords the
server's backend would refuse or ignore are left out of what is sent and checked after
decoding, as the embedded engine's post-hoc path does (runtime.engines.vllm_gaps).

Thinking models and tool_choice "auto" (runtime.thinking.Enforcement): the constraint becomes
an xgrammar *structural tag*, so only the tool-call region (``<tool_call>…</tool_call>``) is
constrained and free text, reasoning included, stays free; with "always" enforcement after
reasoning, the constraint starts when the reasoning region ends.

Faults fail closed and typed: what the server answers is mapped to EngineErrors by the
transport (runtime.engines.vllm_http), and an answer that breaks the contract (usage that is
no token count, no single choice) is EngineUnavailable too (the gateway answers 503 and
writes no receipt). vLLM refuses a max_tokens over max_model_len outright, so the engine
learns the window from /v1/models (as readiness checks it) and lowers max_tokens to it
first; it learns it again after it saw the server unavailable, and when vLLM refuses a
max_tokens as over its window (a restart with a smaller --max-model-len), then sends the
request once more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Self

import aiohttp

from runtime.constraint import Constraint
from runtime.constraint_checks import ConstraintChecks
from runtime.engines.base import (
    NO_BACKEND,
    ChatMessage,
    EngineIdentity,
    FinishReason,
    Generation,
    Sampling,
    StreamEvent,
    TextDelta,
    pinned_order,
)
from runtime.engines.vllm_gaps import Served, served_constraint
from runtime.engines.vllm_http import Exchange, VllmHttp, ends_in_v1, json_object, sse_events
from runtime.engines.vllm_request import request_body
from runtime.errors import EngineConfigError, EngineError, EngineRejected, EngineUnavailable
from runtime.thinking import Enforcement
from runtime.urls import hide_password

# How vLLM (vllm/renderers/params.py) refuses a max_tokens over the window it serves.
_MAX_TOKENS_PAST_WINDOW = "cannot be greater than max_model_len"
LIMITS_RETRY_S = 5.0  # how often a request asks /v1/models for the window until it answers
# No context window comes near this; a usage figure past it (or negative, or not an integer)
# is an upstream breaking its contract, which a receipt must not record.
MAX_USAGE_TOKENS = 2**31 - 1

log = logging.getLogger(__name__)


class VllmEngine:
    """One vLLM server and one served model, through a pooled async HTTP client (one pool
    per event loop, runtime.engines.vllm_http)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        weights_digest: str | None = None,
        model_dir: Path | str | None = None,
        timeout: float = 120.0,
        connect_timeout: float = 5.0,
        request_timeout: float = 600.0,
        backend: str = "xgrammar",
        think_budget: int | None = None,
        max_connections: int = 64,
    ):
        """``backend`` names the server's --structured-outputs-config backend (the manifest
        records it; the server, not this client, picks it). ``model_dir``: a local copy of the
        served weights to compute the digests from (a given ``weights_digest`` wins); without
        it the tokenizer digest is null. ``think_budget`` caps the free reasoning region
        before an "always" constraint (tokens; None: no cap).
        ``timeout`` bounds each wait for the server (a read of a stream or of /v1/models, a
        free connection) and ``request_timeout`` a whole request, stream included: a server
        that trickles bytes cannot hold a request, and the client that waits on it, for
        longer. A non-streaming answer comes in one read once the whole generation is done,
        so only ``request_timeout`` bounds that read.
        """
        tokenizer_digest = None
        if model_dir is not None:
            from runtime.model_store import model_digests

            digests = model_digests(model_dir)
            weights_digest = weights_digest or digests.weights
            tokenizer_digest = digests.tokenizer
        self.identity = EngineIdentity(
            model=model,
            weights_digest=weights_digest,
            tokenizer_digest=tokenizer_digest,
            engine="vllm",
            backends=(backend,),
        )
        self.think_budget = think_budget
        self._http = VllmHttp(
            base_url,
            model,
            api_key=api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            max_connections=max_connections,
        )
        self._checks = ConstraintChecks()
        # the served model's context window, from /v1/models (None: not known or not listed)
        self._max_model_len: int | None = None
        self._limits_due = 0.0  # when to ask /v1/models for the window next (inf: known)
        self._reported: str | None = None  # the last problem ready() logged

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        constraint: Constraint | None,
        sampling: Sampling,
        *,
        enforcement: Enforcement | None = None,
        backend: str | None = None,
    ) -> Generation:
        pinned_order(self.identity, backend)  # the server has one: nothing to choose
        served = await self._prepare(constraint)
        async with self._completion(
            messages, served, sampling, enforcement, whole_answer=True
        ) as response:
            data = json_object(await response.read())
        choice = _only_choice(data)
        prompt_tokens, completion_tokens = _usage(data.get("usage"))
        return Generation(
            text=(choice.get("message") or {}).get("content") or "",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=_finish_reason(choice.get("finish_reason")),
            backend=self._enforced_by(constraint),
            matched_stop=_matched_stop(choice.get("stop_reason"), sampling),
            fallback=served.fallback,
        )

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        constraint: Constraint | None,
        sampling: Sampling,
        *,
        enforcement: Enforcement | None = None,
        backend: str | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """TextDelta per SSE chunk as vLLM sends it, then one final Generation."""
        pinned_order(self.identity, backend)
        served = await self._prepare(constraint)
        parts: list[str] = []
        finish: str | None = None
        stop_reason: Any = None
        usage: Any = None
        async with self._completion(
            messages, served, sampling, enforcement, stream=True
        ) as response:
            async for data in sse_events(response):
                if data.get("usage") is not None:  # vLLM sends null until the last chunk
                    usage = data["usage"]
                for choice in data.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        parts.append(text)
                        yield TextDelta(text)
                    finish = choice.get("finish_reason") or finish
                    stop_reason = choice.get("stop_reason") or stop_reason
        if finish is None:
            raise EngineUnavailable("the vLLM stream ended before a finish_reason")
        prompt_tokens, completion_tokens = _usage(usage)
        yield Generation(
            text="".join(parts),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=_finish_reason(finish),
            backend=self._enforced_by(constraint),
            matched_stop=_matched_stop(stop_reason, sampling),
            fallback=served.fallback,
        )

    def grammar_stats(self) -> None:
        return None  # the server compiles them, and reports its own figures

    async def ready(self) -> bool:
        """The server answers and serves this engine's model (a wrong --model is not ready).
        What keeps it from being ready is logged, once until it changes: /readyz only says
        "not ready", and a wrong URL or model name never heals by itself (ERROR), where a
        server not answering yet may (WARNING)."""
        diagnosis = await self._diagnose()
        problem = None if diagnosis is None else diagnosis[1]
        if problem != self._reported:
            self._reported = problem
            if diagnosis is not None:
                log.log(diagnosis[0], problem, extra={"event": "engine_not_ready"})
        return diagnosis is None

    async def _model_cards(self) -> dict[str, dict[str, Any]]:
        async with self._http.request("GET", "/v1/models") as response:
            data = json_object(await response.read())
        cards = data.get("data")
        if not isinstance(cards, list):
            return {}
        return {m["id"]: m for m in cards if isinstance(m, dict) and isinstance(m.get("id"), str)}

    async def _diagnose(self) -> tuple[int, str] | None:
        """None when the server serves this engine's model, else a log level and what is
        wrong, for the operator (the URL without its password). Learns the model's
        max_model_len on the way."""
        url, model, failure = hide_password(self._http.base_url), self.identity.model, ""
        try:
            cards: dict[str, dict[str, Any]] | None = await self._model_cards()
        except EngineConfigError as exc:  # its credentials: never heals by itself
            return logging.ERROR, f"the vLLM server at {url} is not usable: {exc}"
        except EngineError as exc:
            cards, failure = None, str(exc)
        if (cards is None or model not in cards) and ends_in_v1(url):
            return logging.ERROR, (
                f"vllm_url {url} ends in /v1: drop the /v1 (give the vLLM server's root URL;"
                " the engine adds /v1/... itself)"
            )
        if cards is None:
            self._doubt_window()
            return logging.WARNING, f"the vLLM server at {url} is not ready: {failure}"
        if model not in cards:
            return logging.ERROR, (
                f"the vLLM server at {url} serves the models {sorted(cards)}, not {model!r}:"
                " set the gateway's model setting to the server's --served-model-name"
            )
        limit = cards[model].get("max_model_len")
        self._max_model_len = limit if type(limit) is int and limit > 0 else None
        self._limits_due = math.inf
        return None

    async def _prepare(self, constraint: Constraint | None) -> Served:
        """Before a request: refuse a bad constraint as the embedded engine does (vLLM's own
        answers named its compiler's insides, or let an empty schema through to decode), know
        the context window, and relax what the server's backend cannot enforce
        (runtime.engines.vllm_gaps)."""
        if constraint is not None:
            await self._checks.check(constraint)
        await self._learn_limits()
        return (
            Served(None)
            if constraint is None
            else served_constraint(constraint, self.identity.backend)
        )

    async def _learn_limits(self) -> None:
        """The model's context window, once (each readiness check refreshes it, and it is
        learned again after the server was seen unavailable): vLLM refuses a max_tokens over
        max_model_len outright, where the embedded engine lowers it. Until /v1/models
        answers, asked at most every LIMITS_RETRY_S, not on every request."""
        now = time.monotonic()
        if now >= self._limits_due:
            self._limits_due = now + LIMITS_RETRY_S
            await self._diagnose()  # a server that does not answer fails the request itself

    def _doubt_window(self) -> None:
        """The server was seen unavailable: it may come back with another --max-model-len,
        so the next request asks /v1/models again (a window still being asked for keeps its
        LIMITS_RETRY_S pace)."""
        if self._limits_due == math.inf:
            self._limits_due = 0.0

    @contextlib.asynccontextmanager
    async def _completion(
        self,
        messages: Sequence[ChatMessage],
        served: Served,
        sampling: Sampling,
        enforcement: Enforcement | None,
        *,
        stream: bool = False,
        whole_answer: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One /v1/chat/completions exchange. A server refusing a max_tokens over its
        max_model_len has a smaller window than the engine knew (it restarted with a smaller
        --max-model-len between two requests): the window is learned again and the request
        sent once more, lowered to it."""

        def call() -> Exchange:
            body = self._request_body(messages, served, sampling, enforcement, stream=stream)
            return self._http.request(
                "POST", "/v1/chat/completions", body, whole_answer=whole_answer
            )

        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    response = await stack.enter_async_context(call())
                except EngineRejected as exc:
                    if _MAX_TOKENS_PAST_WINDOW not in exc.message:
                        raise
                    await self._diagnose()
                    response = await stack.enter_async_context(call())
                yield response
        except EngineUnavailable:
            self._doubt_window()
            raise

    async def aclose(self) -> None:
        self._checks.close()
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _request_body(
        self,
        messages: Sequence[ChatMessage],
        served: Served,
        sampling: Sampling,
        enforcement: Enforcement | None,
        *,
        stream: bool,
    ) -> dict[str, Any]:
        return request_body(
            messages,
            served.constraint,
            sampling,
            enforcement,
            model=self.identity.model,
            backend=self.identity.backend,
            stream=stream,
            max_model_len=self._max_model_len,
            think_budget=self.think_budget,
        )

    def _enforced_by(self, constraint: Constraint | None) -> str:
        return self.identity.backend if constraint is not None else NO_BACKEND


def _usage(usage: Any) -> tuple[int, int]:
    """(prompt, completion) tokens as vLLM reports them. They go into receipts and counters,
    so each must be a non-negative integer of a sane size, else the upstream broke its
    contract (503, nothing recorded). A usage (or one of its two figures) not sent at all
    counts 0, as it always has: a proxy that drops it should not fail every request."""
    if usage is None:
        return 0, 0
    if not isinstance(usage, dict):
        raise EngineUnavailable("the vLLM server sent a usage that is not an object")
    counts = []
    for field in ("prompt_tokens", "completion_tokens"):
        value = usage.get(field, 0)
        if type(value) is not int or not 0 <= value <= MAX_USAGE_TOKENS:
            shown = json.dumps(value)[:40]
            raise EngineUnavailable(f"the vLLM server reported usage.{field} = {shown}")
        counts.append(value)
    return counts[0], counts[1]


def _only_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise EngineUnavailable("the vLLM server answered without exactly one choice")
    return choices[0]


def _matched_stop(stop_reason: Any, sampling: Sampling) -> str | None:
    """vLLM's `stop_reason`: the stop string that ended the output, a stop token id, or null
    (EOS, the grammar, the length limit); only one of the request's stop strings counts."""
    return stop_reason if isinstance(stop_reason, str) and stop_reason in sampling.stop else None


def _finish_reason(value: Any) -> FinishReason:
    """vLLM says stop or length; "abort" (or anything else) means the engine gave up."""
    if value in ("stop", "length"):
        return value
    raise EngineUnavailable(f"the vLLM server ended the generation with {value!r}")


__all__ = ["VllmEngine"]
