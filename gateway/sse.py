"""Streaming chat completions as OpenAI-shaped server-sent events.

Order of events: a role chunk, content deltas (answer text streams live, as it decodes), then
-- only after the receipt has committed -- the tool-call deltas, the finish chunk, the usage
chunk when asked for, and `data: [DONE]`. Tool calls are what an agent acts on, so they never
leave before their receipt (fail closed); answer text is informational and streams live. A
fault after the first byte (ledger down, invalid output) ends the stream with an OpenAI error
event instead of [DONE], which the OpenAI SDK raises as an APIError.

While tool calls are held back, nothing else may be sent for as long as they take to decode:
a comment line (`: keep-alive`, which SSE clients skip) goes out with the first token that
comes KEEPALIVE_S or more after the last byte, so that a client's read timeout or a proxy's
idle timeout does not cut the stream while the engine writes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec

from gateway.apikeys import ApiKey
from gateway.completion import (
    Completions,
    PreparedChat,
    cut_short,
    let_go,
    off_loop_for_grammar,
    receipt_ref,
    usage_of,
    withheld,
)
from gateway.errors import error_for
from gateway.recording import finish_reason
from gateway.schemas import (
    ChatCompletionChunk,
    ChunkChoice,
    Delta,
    FinishReason,
    FunctionDelta,
    ReceiptRef,
    ToolCallDelta,
    Usage,
)
from runtime.engines.base import Generation, StreamEvent, TextDelta
from runtime.errors import EngineFault, StructuredOutputInvalid
from runtime.streaming import (
    AnswerDelta,
    ContentDelta,
    EnvelopeEvent,
    EnvelopeStreamDecoder,
    ToolArgumentsDelta,
    ToolCallStart,
)

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
KEEPALIVE_S = 5.0


def event(payload: object) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


class ChunkWriter:
    """Builds the chunks of one completion (shared id, created time, model name and system
    fingerprint)."""

    def __init__(
        self, completion_id: str, created: int, model: str, fingerprint: str, include_usage: bool
    ):
        self._base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
            **({"usage": None} if include_usage else {}),
        }

    def delta(self, delta: Delta, finish: FinishReason | None = None, **extra: object) -> bytes:
        choice = ChunkChoice(index=0, delta=delta, finish_reason=finish)
        return event(ChatCompletionChunk(**self._base, choices=[choice], **extra))

    def usage(self, usage: Usage, receipt: ReceiptRef) -> bytes:
        base = {**self._base, "usage": usage}
        return event(ChatCompletionChunk(**base, choices=[], receipt=receipt))


async def stream_completion(
    completions: Completions,
    prepared: PreparedChat,
    caller: ApiKey,
    events: AsyncIterator[StreamEvent],
    writer: ChunkWriter,
) -> AsyncIterator[bytes]:
    """The SSE body; `events` is the engine's stream (its first event already checked)."""
    links = completions.read_links(caller.tenant, prepared)
    try:
        # OpenAI's role chunk says content "" before text and null before tool calls. Under
        # tools either may follow, so it says neither: the SDK then ends with the text, or
        # with None for calls, as it does on OpenAI.
        tools = prepared.plan.mode == "tools"
        yield writer.delta(Delta(role="assistant", content=None if tools else "", refusal=None))
        decoder = EnvelopeStreamDecoder(prepared.plan)
        held: list[ToolCallStart | ToolArgumentsDelta] = []  # released after the commit
        generation: Generation | None = None
        sent_at = time.monotonic()
        said = False  # any content delta sent
        async for item in events:
            if isinstance(item, TextDelta):
                chunks = _live(writer, decoder.feed(item.text), held)
                said = said or bool(chunks)
                if not chunks and time.monotonic() - sent_at >= KEEPALIVE_S:
                    chunks = [KEEPALIVE]
                for chunk in chunks:
                    yield chunk
                    sent_at = time.monotonic()
            else:
                generation = item
        if generation is None:
            raise EngineFault("the engine's stream ended without its final result")
        completions.count_tokens(generation)
        try:
            rest, parsed = await off_loop_for_grammar(
                prepared.plan,
                lambda: decoder.finish(cut=generation.cut, enforced_by=generation.backend),
            )
        except StructuredOutputInvalid as exc:
            raise withheld(cut_short(exc, generation, prepared), prepared) from None
        chunks = _live(writer, rest, held)
        if tools and not said and not chunks and not parsed.tool_calls:
            # an empty answer: "" as the whole answer's content, not the role chunk's null
            chunks = [writer.delta(Delta(content=""))]
        for chunk in chunks:
            yield chunk
        receipt = await completions.record(prepared, caller, generation, parsed, links)
        for call_event in held:
            yield writer.delta(Delta(tool_calls=[_tool_delta(call_event)]))
        ref = receipt_ref(receipt)
        finish = finish_reason(parsed, generation)
        if prepared.include_usage:
            yield writer.delta(Delta(), finish)
            yield writer.usage(usage_of(generation), ref)
        else:
            yield writer.delta(Delta(), finish, receipt=ref)
        yield DONE
    except Exception as exc:  # noqa: BLE001 - every fault becomes the stream's error event
        _, body = error_for(exc)
        # the response's status (200) went out with the headers: count the failure here
        completions.metrics.stream_errors.labels(str(body["error"]["code"])).inc()
        yield event(body)
    finally:
        let_go(links)
        await events.aclose()


def _live(
    writer: ChunkWriter, events: list[EnvelopeEvent], held: list[ToolCallStart | ToolArgumentsDelta]
) -> list[bytes]:
    """Chunks for text that may leave now; tool-call events are held back in `held`."""
    chunks = []
    for decoded in events:
        if isinstance(decoded, ContentDelta | AnswerDelta):
            chunks.append(writer.delta(Delta(content=decoded.text)))
        else:
            held.append(decoded)
    return chunks


def _tool_delta(decoded: ToolCallStart | ToolArgumentsDelta) -> ToolCallDelta:
    if isinstance(decoded, ToolCallStart):
        return ToolCallDelta(
            index=decoded.index,
            id=decoded.id,
            type="function",
            function=FunctionDelta(name=decoded.name, arguments=""),
        )
    return ToolCallDelta(index=decoded.index, function=FunctionDelta(arguments=decoded.text))
