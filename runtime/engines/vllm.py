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

Faults fail closed and typed: unreachable, timed out, 5xx, a redirect (never followed: it
would carry the request and the API key elsewhere), a server that refuses the gateway's own
credentials, model name or URL (a 404 says which setting), or an answer that breaks the
contract (usage that is no token count) -> EngineUnavailable (the gateway answers 503 and
writes no receipt); a 400/413/422 about the request itself -> EngineRejected with vLLM's
message (bounded), which the gateway passes on as the matching 4xx, except a prompt over the
model's context window, which is the same ``context_length_exceeded`` the embedded engine
raises. vLLM refuses a max_tokens over max_model_len outright, so the engine learns the
window from /v1/models (as readiness checks it) and lowers max_tokens to it first; it learns
it again after it saw the server unavailable, and when vLLM refuses a max_tokens as over
its window (a restart with a smaller --max-model-len), then sends the request once more.

The HTTP client is aiohttp: measured against a local server that answers at once, it costs
0.13 ms of CPU per request where httpx costs 0.62 ms, and 0.08 ms against 2.5 ms with 32
requests in flight (httpcore polls every pooled connection on each request). On a 2-core host
that CPU is taken from the vLLM server beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp
import msgspec

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
from runtime.engines.vllm_request import request_body
from runtime.errors import EngineError, EngineRejected, EngineUnavailable, RuntimeInputError
from runtime.thinking import Enforcement
from runtime.urls import hide_password

# The statuses that mean "this request is wrong" (the client can fix it). Any other 4xx from
# vLLM (401/403: our key, 404: our model name, 429: overload) is the gateway's problem: 503.
CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})
# How vLLM's prompt length checks (vllm/renderers/params.py) begin their 400 message.
_CONTEXT_WINDOW_WORDS = "This model's maximum context length is"
# How vLLM (vllm/renderers/params.py) refuses a max_tokens over the window it serves.
_WINDOW_WORDS = "cannot be greater than max_model_len"
KEEPALIVE_S = 4.0
LIMITS_RETRY_S = 5.0  # how often a request asks /v1/models for the window until it answers
# How much of vLLM's own error message reaches the agent (as for a raw body).
MAX_MESSAGE_CHARS = 2000
# No context window comes near this; a usage figure past it (or negative, or not an integer)
# is an upstream breaking its contract, which a receipt must not record.
MAX_USAGE_TOKENS = 2**31 - 1

log = logging.getLogger(__name__)


class VllmEngine:
    """One vLLM server and one served model, through a pooled async HTTP client (one pool
    per event loop, see _http)."""

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
        self._base_url = base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # `connect` bounds the wait for a pooled connection (all busy) and DNS as well
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout, connect=timeout, sock_connect=connect_timeout, sock_read=timeout
        )
        self._whole_answer_timeout = aiohttp.ClientTimeout(
            total=request_timeout, connect=timeout, sock_connect=connect_timeout
        )
        self._max_connections = max_connections
        self._client: aiohttp.ClientSession | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
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
            messages, served, sampling, enforcement, timeout=self._whole_answer_timeout
        ) as response:
            data = _json(await response.read())
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
            async for data in _sse_events(response):
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
        async with self._request("GET", "/v1/models") as response:
            data = _json(await response.read())
        cards = data.get("data")
        if not isinstance(cards, list):
            return {}
        return {m["id"]: m for m in cards if isinstance(m, dict) and isinstance(m.get("id"), str)}

    async def _diagnose(self) -> tuple[int, str] | None:
        """None when the server serves this engine's model, else a log level and what is
        wrong, for the operator (the URL without its password). Learns the model's
        max_model_len on the way."""
        url, model, failure = hide_password(self._base_url), self.identity.model, ""
        try:
            cards: dict[str, dict[str, Any]] | None = await self._model_cards()
        except EngineError as exc:
            cards, failure = None, str(exc)
        if (cards is None or model not in cards) and _ends_in_v1(url):
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
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One /v1/chat/completions exchange. A server refusing a max_tokens over its
        max_model_len has a smaller window than the engine knew (it restarted with a smaller
        --max-model-len between two requests): the window is learned again and the request
        sent once more, lowered to it."""

        def call() -> _Exchange:
            body = self._request_body(messages, served, sampling, enforcement, stream=stream)
            return self._call(body, timeout=timeout)

        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    response = await stack.enter_async_context(call())
                except EngineRejected as exc:
                    if _WINDOW_WORDS not in exc.message:
                        raise
                    await self._diagnose()
                    response = await stack.enter_async_context(call())
                yield response
        except EngineUnavailable:
            self._doubt_window()
            raise

    async def aclose(self) -> None:
        self._closed = True
        self._checks.close()
        client, self._client = self._client, None
        if client is not None and self._client_loop is asyncio.get_running_loop():
            await client.close()  # a pool of another (finished) loop cannot be closed here

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

    # ------------------------------------------------------------------ transport

    def _call(
        self, body: dict[str, Any], *, timeout: aiohttp.ClientTimeout | None = None
    ) -> _Exchange:
        return self._request("POST", "/v1/chat/completions", body, timeout=timeout)

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> _Exchange:
        """One exchange; ``timeout`` replaces the session's (per-read) one. Redirects are not
        followed: they would carry the request, and the vLLM API key, to another server."""
        data = None if body is None else msgspec.json.encode(body)
        options: dict[str, Any] = {"allow_redirects": False}
        if timeout is not None:
            options["timeout"] = timeout
        request = self._http().request(method, self._base_url + path, data=data, **options)
        return _Exchange(request, self._base_url, self.identity.model)

    def _http(self) -> aiohttp.ClientSession:
        """The pooled client of the running event loop. Pooled connections belong to the loop
        that opened them, so a caller on a new loop (a CLI run after startup, a test per
        asyncio.run) gets a new pool instead of another loop's dead sockets."""
        if self._closed:
            raise EngineUnavailable("the vLLM engine is closed")
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = aiohttp.ClientSession(
                # idle connections are dropped before the server's own keep-alive (uvicorn's
                # 5 s) closes them, so a request is never sent on a connection being closed
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections, keepalive_timeout=KEEPALIVE_S
                ),
                headers=self._headers,
                timeout=self._timeout,
                raise_for_status=False,
            )
            self._client_loop = loop
        return self._client


class _Exchange:
    """One HTTP exchange as an async context manager that raises only EngineErrors: transport
    failures and unusable statuses are mapped when the response head arrives; read errors
    while the body streams are mapped too, so a server dying mid-stream is EngineUnavailable."""

    def __init__(self, request: Any, base_url: str, model: str) -> None:
        self._request = request  # aiohttp's _RequestContextManager: sent on __aenter__
        self._response: aiohttp.ClientResponse | None = None
        self._base_url = base_url  # for what a 404 says
        self._model = model

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            response = await self._request.__aenter__()
        except TRANSPORT_ERRORS as exc:
            raise _unavailable(exc) from exc
        if response.status >= 300:
            try:
                raw = await response.read()
            except TRANSPORT_ERRORS as exc:
                raw = str(exc).encode()
            finally:
                response.release()
            raise _status_error(response.status, raw, base_url=self._base_url, model=self._model)
        self._response = response
        return response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._response is not None:
            self._response.release()
        if isinstance(exc, TRANSPORT_ERRORS):
            raise _unavailable(exc) from exc


# what aiohttp raises when the server is down, hangs up, times out or sends a broken body
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


def _unavailable(exc: BaseException) -> EngineUnavailable:
    if isinstance(exc, TimeoutError):
        return EngineUnavailable(f"the vLLM server timed out ({type(exc).__name__})")
    return EngineUnavailable(f"the vLLM server is unreachable: {exc or type(exc).__name__}")


def _status_error(
    status: int, raw: bytes, *, base_url: str = "", model: str = ""
) -> RuntimeInputError | EngineRejected | EngineUnavailable:
    message = _error_message(raw)
    if 300 <= status < 400:
        return EngineUnavailable(
            f"the vLLM server answered {status}, a redirect, which the gateway does not follow:"
            " its vllm_url must name the vLLM server itself"
        )
    if status == 404:
        return EngineUnavailable(_not_found(message, base_url, model))
    if status in CLIENT_FAULT_STATUSES and _CONTEXT_WINDOW_WORDS in message:
        # vLLM lowers max_tokens to the room left (the embedded engine does the same), so only
        # the prompt itself can be too long.
        return RuntimeInputError(message, param="messages", code="context_length_exceeded")
    if status in CLIENT_FAULT_STATUSES:
        return EngineRejected(status, message)
    # Not the client's fault: its words about the server's insides (traces, paths) are for
    # the operator, who has the vLLM server's own log; the agent learns the status only.
    return EngineUnavailable(f"the vLLM server answered {status}")


def _not_found(message: str, base_url: str, model: str) -> str:
    """A 404 is the gateway's configuration (its URL or model name), never the request's:
    the message says which setting to fix, with vLLM's own words."""
    said = f"the vLLM server answered 404 ({message})"
    if _ends_in_v1(base_url):
        return f"{said}: the gateway's vllm_url ends in /v1; drop it (the server's root URL)"
    if "model" in message.lower():
        return f"{said}: it does not serve {model!r}, the model the gateway is configured with"
    return f"{said}: the gateway's vllm_url is not the root URL of a vLLM server"


def _ends_in_v1(url: str) -> bool:
    """An OpenAI-style base URL (``http://host:8000/v1``), where the engine wants the root."""
    return urlsplit(url).path.rstrip("/").endswith("/v1")


def _error_message(raw: bytes) -> str:
    """vLLM's own words, at most MAX_MESSAGE_CHARS of them: they reach the agent."""
    return _full_error_message(raw)[:MAX_MESSAGE_CHARS]


def _full_error_message(raw: bytes) -> str:
    """``{"error": {"message": ...}}`` (or FastAPI's ``{"detail": ...}``), else the body."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip() or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if data.get("detail"):
            return str(data["detail"])
        if isinstance(data.get("message"), str):
            return data["message"]
    return json.dumps(data)


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


def _json(raw: bytes) -> dict[str, Any]:
    try:
        data = msgspec.json.decode(raw)
    except ValueError as exc:  # msgspec.DecodeError, or UnicodeDecodeError for bad UTF-8
        raise EngineUnavailable(f"the vLLM server sent invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise EngineUnavailable("the vLLM server sent JSON that is not an object")
    return data


async def _sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of an OpenAI-style SSE stream, up to ``data: [DONE]``. An error event
    in the stream (vLLM sends one when generation fails after the head) fails closed."""
    async for line in _lines(response):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        data = _json(payload)
        if "error" in data:
            raise EngineUnavailable(f"the vLLM stream failed: {_error_message(payload)}")
        yield data


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body's lines as they arrive, in linear time and without readline's length cap:
    only each new chunk is searched for newlines."""
    partial: list[bytes] = []
    async for chunk in response.content.iter_any():
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            partial.append(piece)
            yield b"".join(partial)
            partial = []
        partial.append(rest)
    if any(partial):
        yield b"".join(partial)


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
