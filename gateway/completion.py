"""One chat completion, from validated request to committed receipt. No HTTP here: chat.py
and sse.py shape the answers, from the body parts both share (`usage_of`, `receipt_ref`).

    prepare (parameters, plan, limits)  ->  engine  ->  plan.parse  ->  ledger.append

The receipt is committed before the caller gets anything it could act on; a ledger fault
propagates (LedgerUnavailable -> 503) and the output is dropped. Streaming lives in sse.py
on top of the same `prepare` and `record`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from gateway.apikeys import ApiKey
from gateway.deadline import db_deadline
from gateway.errors import model_not_served
from gateway.logs import request_id
from gateway.metrics import Metrics
from gateway.recording import draft_for, manifest_for, request_record, with_caller
from gateway.schemas import OFF_VALUES, ChatCompletionRequest, ReceiptRef, Usage, to_plain
from gateway.settings import Settings
from receipts.errors import CanonicalizationError, LedgerUnavailable
from receipts.ledger import Ledger
from receipts.record import Receipt
from runtime.engines.base import Engine, EngineIdentity, Generation, Sampling, StreamEvent
from runtime.errors import RuntimeInputError, StructuredOutputInvalid, UnsupportedParameter
from runtime.limits import check_constraint, check_tool_count
from runtime.output_parsing import ParsedResponse
from runtime.planning import ChatInput, Plan, plan_chat
from runtime.streaming import parse_output

T = TypeVar("T")
log = logging.getLogger("callproof.gateway")
_SEED_BOUND = 2**31  # a seed every engine accepts
Link = dict[str, str | None]  # a tool message's call id and the receipt that issued it


@dataclass(frozen=True)
class PreparedChat:
    """A request that passed every check that does not need the model."""

    body: dict[str, Any]  # the request as the gateway read it (unset parameters absent)
    request_record: dict[str, Any]  # the receipt's digests of the request as the client sent it
    plan: Plan
    sampling: Sampling
    stream: bool
    include_usage: bool
    max_tokens_param: str  # the parameter a 422 for a cut-off output tells to raise


def _refuse_unsupported(request: ChatCompletionRequest) -> None:
    """A parameter set to what the gateway cannot honour: a 400 naming it, never silently
    dropped."""
    for name, neutral in OFF_VALUES.items():
        value = getattr(request, name)
        if value is not None and value != neutral:
            raise UnsupportedParameter(
                f"{name}={msgspec.json.encode(value).decode()} is not supported here;"
                f" leave it out or send {msgspec.json.encode(neutral).decode()}",
                param=name,
            )
    if request.stream_options is not None and not request.stream:
        raise UnsupportedParameter(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    if request.stream_options is not None and request.stream_options.include_obfuscation:
        raise UnsupportedParameter(
            "stream_options.include_obfuscation=true is not supported here: the gateway does"
            " not pad its chunks; leave it out or send false",
            param="stream_options.include_obfuscation",
        )


def _sampling(request: ChatCompletionRequest, settings: Settings) -> Sampling:
    """OpenAI's defaults, plus a seed minted when none is given so every receipt replays."""
    max_tokens = request.max_completion_tokens or request.max_tokens or settings.default_max_tokens
    if max_tokens > settings.max_tokens_limit:
        param = _max_tokens_param(request)
        raise UnsupportedParameter(
            f"{param}={max_tokens} is over this gateway's limit of {settings.max_tokens_limit}",
            param=param,
            code="max_tokens_too_large",
        )
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    return Sampling(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        max_tokens=max_tokens,
        seed=request.seed if request.seed is not None else secrets.randbelow(_SEED_BOUND),
        stop=stop,
    )


def _max_tokens_param(request: ChatCompletionRequest) -> str:
    """The parameter that set the token limit: max_completion_tokens when given (it wins
    over max_tokens, as OpenAI reads them)."""
    return "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"


def system_fingerprint(identity: EngineIdentity) -> str:
    """OpenAI's `system_fingerprint`: it changes when what makes the output does (model,
    weights, tokenizer, engine, grammar backends), so a client comparing seeded answers knows
    when to expect a difference. The receipt's manifest binds the same facts, and more."""
    facts = msgspec.json.encode(dataclasses.asdict(identity))
    return "fp_" + hashlib.sha256(facts).hexdigest()[:10]


class Completions:
    """Runs prepared requests on the engine and receipts them in the ledger."""

    def __init__(self, engine: Engine, ledger: Ledger, settings: Settings, metrics: Metrics):
        self.started_at = int(time.time())
        self.engine = engine
        self.fingerprint = system_fingerprint(engine.identity)
        self.ledger = ledger
        self.settings = settings
        self.metrics = metrics

    def prepare(
        self,
        request: ChatCompletionRequest,
        *,
        sent: dict[str, Any] | None = None,
        sampling: Sampling | None = None,
    ) -> PreparedChat:
        """Validate, plan and limit-check a request for this gateway's settings and served
        model. `sent` is the body exactly as the client sent it, which the receipt's digests
        cover (default: the request itself); `sampling` overrides the request's (replay)."""
        settings, served_model = self.settings, self.engine.identity.model
        _refuse_unsupported(request)
        if request.model != served_model:
            raise model_not_served(request.model, served_model)
        limits = settings.limits
        if request.tools:
            check_tool_count(len(request.tools), limits)
        body = to_plain(request)
        plan = plan_chat(
            ChatInput(
                messages=body["messages"],
                tools=body.get("tools"),
                tool_choice=body.get("tool_choice"),
                parallel_tool_calls=body.get("parallel_tool_calls"),
                response_format=body.get("response_format"),
                regex=request.regex,
                grammar=request.grammar,
                model=served_model,
            ),
            reasoning=settings.reasoning,
            limits=limits,
        )
        if plan.constraint is not None:
            check_constraint(plan.constraint, limits)
        # Before the record: a max_tokens over the limit is named as such, not as a number the
        # receipt cannot hold exactly.
        sampling = sampling or _sampling(request, settings)
        try:
            digests = request_record(
                body if sent is None else sent, retain_payload=settings.retain_payloads
            )
        except CanonicalizationError as exc:
            raise RuntimeInputError(f"the request cannot be recorded exactly: {exc}") from None
        return PreparedChat(
            body=body,
            request_record=digests,
            plan=plan,
            sampling=sampling,
            stream=bool(request.stream),
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            max_tokens_param=_max_tokens_param(request),
        )

    async def generate(
        self, prepared: PreparedChat, *, backend: str | None = None
    ) -> tuple[Generation, ParsedResponse]:
        """The engine's output, parsed; ``backend`` pins the grammar backend (Engine)."""
        plan = prepared.plan
        try:
            generation = await self.engine.generate(
                plan.messages,
                plan.constraint,
                prepared.sampling,
                enforcement=plan.enforcement,
                backend=backend,
            )
        except StructuredOutputInvalid as exc:  # the fallback path failed
            raise withheld(exc, prepared) from None
        self.count_tokens(generation)
        try:
            parsed = await off_loop_for_grammar(
                plan,
                lambda: parse_output(
                    plan, generation.text, cut=generation.cut, enforced_by=generation.backend
                ),
            )
            return generation, parsed
        except StructuredOutputInvalid as exc:
            raise withheld(cut_short(exc, generation, prepared), prepared) from None

    async def answer(
        self, prepared: PreparedChat, caller: ApiKey
    ) -> tuple[Generation, ParsedResponse, Receipt]:
        """Generate, then record (the links read under way meanwhile): one awaitable, so that
        a client who leaves while either is under way cancels both (gateway.disconnect), the
        receipt's wait for the database's lock included."""
        links = self.read_links(caller.tenant, prepared)
        try:
            generation, parsed = await self.generate(prepared)
            return (
                generation,
                parsed,
                await self.record(prepared, caller, generation, parsed, links),
            )
        finally:
            let_go(links)

    async def open_stream(self, prepared: PreparedChat) -> AsyncIterator[StreamEvent]:
        """The engine's event stream, started: engine faults raise here, before any byte."""
        plan = prepared.plan
        events = self.engine.stream(
            plan.messages, plan.constraint, prepared.sampling, enforcement=plan.enforcement
        )
        try:
            first = await anext(events)
        except StructuredOutputInvalid as exc:  # the fallback path failed
            raise withheld(exc, prepared) from None
        return _prepend(first, events)

    async def record(
        self,
        prepared: PreparedChat,
        caller: ApiKey,
        generation: Generation,
        parsed: ParsedResponse,
        links: asyncio.Future[list[Link]],
    ) -> Receipt:
        """Append the receipt to the caller's tenant chain, with the ``links`` read_links
        started; returns once it is durable (raises LedgerUnavailable if not, or if the
        database does not answer within db_timeout_s: a hung server fails closed)."""
        plan = prepared.plan
        async with db_deadline(
            self.settings.db_timeout_s,
            LedgerUnavailable,
            "the ledger database (the receipt's commit)",
        ):
            draft = draft_for(
                tenant=caller.tenant,
                plan=plan,
                manifest=manifest_for(
                    plan, self.engine.identity, prepared.sampling, generation.backend
                ),
                request=with_caller(prepared.request_record, caller.id, request_id.get()),
                generation=generation,
                parsed=parsed,
                links=await self._links_read(links, caller.tenant, plan.tool_call_ids_answered),
            )
            started = time.perf_counter()
            future = self.ledger.submit(draft)
            try:
                receipt = await asyncio.wrap_future(future)
            except asyncio.CancelledError:  # the deadline passed, or the client went away
                future.add_done_callback(self._committed_late(request_id.get()))
                raise
        self.metrics.append_latency.observe(time.perf_counter() - started)
        self.metrics.receipts.inc()
        return receipt

    def _committed_late(self, request: str | None) -> Callable[[Future[Receipt]], None]:
        """A receipt whose commit was under way when its request gave up (a 503 at the
        deadline, a client gone) may still land: the log line and the counter are how an
        operator reconciles it with the request that never got its tool calls."""

        def landed(future: Future[Receipt]) -> None:
            if future.cancelled() or future.exception() is not None:
                return  # never sealed: nothing to reconcile
            receipt = future.result()
            self.metrics.receipts.inc()
            self.metrics.receipts_committed_late.inc()
            log.warning(
                "receipt committed after its request gave up",
                extra={
                    "event": "receipt_committed_late",
                    "request_id": request,
                    "receipt_id": receipt.id,
                    "chain": receipt.chain,
                    "seq": receipt.seq,
                },
            )

        return landed

    def count_tokens(self, generation: Generation) -> None:
        """Count what the engine processed as soon as it is done: a generation that ends in
        a 422, a 503 or a client gone cost the engine as much as one that is receipted."""
        self.metrics.tokens.labels("prompt").inc(generation.prompt_tokens)
        self.metrics.tokens.labels("completion").inc(generation.completion_tokens)

    def read_links(self, tenant: str, prepared: PreparedChat) -> asyncio.Future[list[Link]]:
        """Start reading which receipts issued the calls the request's tool messages answer
        (unknown ids: null), for `record`. Started with the generation (a stream's once its
        first token is out), so that the read (a transaction, 32 ids per query) runs while
        the engine works instead of after it; whoever starts it `let_go`es it once the
        answer is recorded or has failed."""
        call_ids = prepared.plan.tool_call_ids_answered
        if not call_ids:
            done: asyncio.Future[list[Link]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        return asyncio.ensure_future(asyncio.to_thread(self._links, tenant, call_ids))

    def _links(self, tenant: str, call_ids: tuple[str, ...]) -> list[Link]:
        issued = self.ledger.issuers(tenant, call_ids)
        return [{"tool_call_id": c, "receipt_id": issued.get(c)} for c in call_ids]

    async def _links_read(
        self, links: asyncio.Future[list[Link]], tenant: str, call_ids: tuple[str, ...]
    ) -> list[Link]:
        """`links`' result; read again if it failed for want of the database, which may
        have come back while the engine generated (the read is only a read)."""
        try:
            return await links
        except LedgerUnavailable:
            return await asyncio.to_thread(self._links, tenant, call_ids)


def let_go(links: asyncio.Future[list[Link]]) -> None:
    """Done with a read_links read: cancelled if still under way (the answer failed first),
    its error marked as seen if it failed unawaited (asyncio would log it as lost)."""
    if not links.cancel() and not links.cancelled():
        links.exception()


async def off_loop_for_grammar(plan: Plan, parse: Callable[[], T]) -> T:
    """``parse()``, the output's parse: in a worker thread for grammar output, which
    llguidance's parser may read again a byte at a time (runtime.grammar_check); a large
    grammar would hold the event loop, and every other request with it."""
    if plan.mode == "ebnf":
        return await asyncio.to_thread(parse)
    return parse()


def cut_short(
    error: StructuredOutputInvalid, generation: Generation, prepared: PreparedChat
) -> StructuredOutputInvalid:
    """A tool call the token limit or a stop string cut off fails for that reason, and the
    fix is in that parameter: say so and name it, instead of only where the JSON broke."""
    if generation.finish_reason == "length":
        param = prepared.max_tokens_param
        why = f"{param}={prepared.sampling.max_tokens} ran out before the constrained output was"
        fix = f"raise {param}"
    elif generation.matched_stop is not None:
        param = "stop"
        why = f"the stop string {generation.matched_stop!r} ended the output before it was"
        fix = "use stop strings the output cannot contain"
    else:
        return error
    return StructuredOutputInvalid(
        f"{why} complete; {fix} ({error.message})",
        schema=error.schema,
        raw_output=error.raw_output,
        pointer=error.pointer,
        param=param,
    )


def withheld(error: StructuredOutputInvalid, prepared: PreparedChat) -> StructuredOutputInvalid:
    """The 422 as it may leave the gateway: under tools without the raw output, whose calls
    (whole ones, before the one that failed) no receipt records, and a tool call leaves only
    with its receipt. The message and the pointer still say where and why it failed."""
    if prepared.plan.mode != "tools" or error.raw_output is None:
        return error
    return StructuredOutputInvalid(
        f"{error.message}; raw_output withheld: tool calls leave only with their receipt",
        schema=error.schema,
        raw_output=None,
        pointer=error.pointer,
        param=error.param,
    )


async def _prepend(
    first: StreamEvent, rest: AsyncIterator[StreamEvent]
) -> AsyncIterator[StreamEvent]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def usage_of(generation: Generation) -> Usage:
    return Usage(
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        total_tokens=generation.prompt_tokens + generation.completion_tokens,
    )


def receipt_ref(receipt: Receipt) -> ReceiptRef:
    return ReceiptRef(receipt.id, receipt.seq, receipt.entry_hash, receipt.manifest_hash)
