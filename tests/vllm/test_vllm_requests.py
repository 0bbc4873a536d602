"""What VllmEngine sends, without a server: the request body and the structured-outputs field
for every constraint kind and enforcement mode. Structural tags are also compiled by xgrammar
(the library vLLM hands them to), so a tag vLLM would reject fails here first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import jsonschema
import pytest
import xgrammar

from runtime.constraint import Constraint
from runtime.engines.base import ChatMessage, Generation, Sampling
from runtime.engines.vllm import VllmEngine
from runtime.engines.vllm_gaps import served_constraint
from runtime.engines.vllm_http import json_object, status_error
from runtime.engines.vllm_request import request_body, structured_outputs
from runtime.errors import EngineConfigError, EngineRejected, EngineUnavailable
from runtime.thinking import Enforcement
from runtime.tools import parse_tools_field
from runtime.union_schema import union_schema

TOOLS = parse_tools_field(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"$ref": "#/$defs/city"}},
                    "required": ["city"],
                    "$defs": {"city": {"type": "string", "enum": ["Paris", "Lima"]}},
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
            },
        },
    ]
)


def union(choice: Any = "auto", parallel: bool = False) -> Constraint:
    return Constraint.json_schema(union_schema(TOOLS, choice, None, parallel), kind="tools")


def structural_tag(field: dict[str, Any]) -> dict[str, Any]:
    tag = json.loads(field["structural_tag"])
    xgrammar.Grammar.from_structural_tag(field["structural_tag"])  # vLLM would accept it
    return tag


def test_request_body_carries_messages_sampling_and_the_constraint() -> None:
    target = {"model": "served-name", "backend": "xgrammar"}
    sampling = Sampling(temperature=0.5, top_p=0.9, max_tokens=7, seed=3, stop=("\n",))
    body = request_body(
        [ChatMessage("system", "s"), ChatMessage("user", "u")],
        Constraint.regex("[a-z]+"),
        sampling,
        stream=True,
        **target,
    )
    assert body == {
        "model": "served-name",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["\n"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "structured_outputs": {"regex": "[a-z]+"},
    }
    free = request_body([ChatMessage("user", "u")], None, Sampling(), stream=False, **target)
    assert "structured_outputs" not in free and "seed" not in free and "stop" not in free


@pytest.mark.parametrize(
    "constraint, expected",
    [
        (Constraint.json_schema({"type": "integer"}), {"json": {"type": "integer"}}),
        (Constraint.regex("a|b"), {"regex": "a|b"}),
        (Constraint.ebnf('root ::= "x"'), {"grammar": 'root ::= "x"'}),
    ],
    ids=["json", "regex", "ebnf"],
)
def test_plain_constraints_use_vllms_fields(constraint: Constraint, expected: Any) -> None:
    assert structured_outputs(constraint) == expected
    assert structured_outputs(constraint, Enforcement(mode="always")) == expected


@pytest.mark.parametrize("parallel", [False, True])
def test_auto_on_a_thinking_model_is_one_triggered_tag_per_tool(parallel: bool) -> None:
    tag = structural_tag(structured_outputs(union(parallel=parallel), Enforcement("triggered")))
    fmt = tag["format"]
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"]
    assert fmt["stop_after_first"] is not parallel and fmt["at_least_one"] is False
    begins = [t["begin"] for t in fmt["tags"]]
    assert begins == [
        '<tool_call>\n{"name": "get_weather", "arguments": ',
        '<tool_call>\n{"name": "get_time", "arguments": ',
    ]
    weather = fmt["tags"][0]["content"]["json_schema"]  # embedded $refs still resolve:
    jsonschema.validate({"city": "Lima"}, weather)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"city": "Rome"}, weather)


def test_named_choice_after_reasoning_is_free_thinking_then_the_union() -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    constraint = union(named)
    tag = structural_tag(
        structured_outputs(constraint, Enforcement("always", reasoning=True), think_budget=64)
    )
    thinking, answer = tag["format"]["elements"]
    assert thinking == {
        "type": "tag",
        "begin": "<think>",
        "content": {"type": "any_text", "max_tokens": 64},
        "end": "</think>",
    }
    assert answer["type"] == "json_schema" and answer["json_schema"] == constraint.schema()


def test_regex_after_reasoning_keeps_its_kind() -> None:
    tag = structural_tag(
        structured_outputs(Constraint.regex("[0-9]+"), Enforcement("always", reasoning=True))
    )
    assert tag["format"]["elements"][1] == {"type": "regex", "pattern": "[0-9]+"}
    assert "max_tokens" not in tag["format"]["elements"][0]["content"]  # no budget: unbounded


def test_triggered_needs_a_tool_union_with_calls() -> None:
    with pytest.raises(ValueError, match="tool union"):
        structured_outputs(Constraint.regex("x"), Enforcement("triggered"))
    with pytest.raises(ValueError, match="no tool call"):
        structured_outputs(union("none"), Enforcement("triggered"))


def test_structural_tags_are_refused_for_a_non_xgrammar_server() -> None:
    ask = [ChatMessage("user", "u")]
    body = request_body(ask, union(), Sampling(), model="m", backend="guidance", stream=False)
    assert "json" in body["structured_outputs"]  # plain constraints work on any backend
    with pytest.raises(EngineUnavailable, match="xgrammar"):
        request_body(
            ask,
            union(),
            Sampling(),
            Enforcement("triggered"),
            model="m",
            backend="guidance",
            stream=False,
        )


@pytest.mark.parametrize(
    ("part", "left_out"),
    [
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        *(({"type": "string", "format": f}, "format") for f in ("uri-reference", "idn-email")),
        ({"type": "string", "format": "json-pointer", "maxLength": 9}, "format"),
    ],
)
def test_what_the_guidance_backend_refuses_is_left_to_the_check(part: Any, left_out: str) -> None:
    """vLLM's guidance backend is llguidance, which refuses a oneOf it cannot prove disjoint
    and a format it does not know (a 400 naming neither place nor keyword). What is sent
    compiles in llguidance; the output is checked against the whole schema after decoding."""
    from llguidance import LLMatcher

    schema = {"type": "object", "properties": {"v": part}, "required": ["v"]}
    for constraint in (
        Constraint.json_schema(schema),
        Constraint.json_schema(
            union_schema(
                parse_tools_field(
                    [{"type": "function", "function": {"name": "t", "parameters": schema}}]
                ),
                "required",
                None,
                False,
            ),
            kind="tools",
        ),
    ):

        def refusal(sent: Constraint) -> str:
            return LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(sent.schema()))

        served = served_constraint(constraint, "guidance")
        assert refusal(constraint) and not refusal(served.constraint), served
        assert served.fallback == f"post_hoc_check:{left_out}"


@pytest.mark.parametrize(
    "raw",
    [b"", b"<html>bad gateway</html>", b'{"text": "\xff"}', b"[1, 2]"],
    ids=["empty", "html", "bad-utf8", "not-an-object"],
)
def test_an_upstream_body_that_is_not_a_json_object_is_engine_unavailable(raw: bytes) -> None:
    """What a broken proxy in front of vLLM may send: a 503 naming the engine, not a 500."""
    with pytest.raises(EngineUnavailable, match="the vLLM server sent"):
        json_object(raw)


def test_a_server_that_trickles_its_answer_is_cut_off_at_the_request_deadline() -> None:
    """Every read succeeds (one byte each 0.1 s), so only the whole-request deadline ends it:
    what a wedged proxy in front of vLLM can do."""

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: 100000\r\n\r\n")
        try:
            for _ in range(100_000):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.1)
        except ConnectionError:
            pass

    async def go() -> float:
        server = await asyncio.start_server(trickle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = VllmEngine(f"http://127.0.0.1:{port}", "m", timeout=5, request_timeout=1)
        started = time.monotonic()
        try:
            with pytest.raises(EngineUnavailable, match="timed out"):
                await engine.generate([ChatMessage("user", "hi")], None, Sampling(max_tokens=4))
            return time.monotonic() - started
        finally:
            await engine.aclose()
            server.close()

    assert asyncio.run(go()) < 3


def test_a_server_fault_reaches_the_client_as_its_status_only() -> None:
    """The body of a 500 can hold the server's traceback and paths: not for agents."""
    error = status_error(500, b'{"error": {"message": "Traceback ... /srv/vllm/engine.py"}}')
    assert isinstance(error, EngineUnavailable)
    assert str(error) == "the vLLM server answered 500"
    assert isinstance(status_error(400, b'{"error": {"message": "bad n"}}'), EngineRejected)


def test_xgrammars_log_location_is_not_passed_on() -> None:
    """vLLM passes on xgrammar's messages with the C++ file and line they were logged at."""
    said = "Failed to transform json schema: [07:34:51] /project/cpp/json_schema.cc:4944: min > 0"
    error = status_error(400, json.dumps({"error": {"message": said}}).encode())
    assert isinstance(error, EngineRejected)
    assert error.message == "Failed to transform json schema: min > 0"


# ---------------------------------------------------------------- odd upstream answers
# A small real HTTP server per test plays the upstream: what a proxy, a misconfigured URL or
# a broken server in front of vLLM can send.

Handler = Callable[[bytes], Awaitable[list[bytes]]]


def completion(usage: Any = None, **extra: Any) -> dict[str, Any]:
    """A chat completion as vLLM shapes it, with ``usage`` as given (None: none sent)."""
    body: dict[str, Any] = {
        "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
        **extra,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def answer(data: Any, status: str = "200 OK", headers: str = "") -> list[bytes]:
    raw = json.dumps(data).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n{headers}"
    return [f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw]


def sse(*events: Any) -> list[bytes]:
    """An SSE answer, one write per event (each a separate read for the client)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    return [head, *(f"data: {json.dumps(e)}\n\n".encode() for e in events), b"data: [DONE]\n\n"]


@contextlib.asynccontextmanager
async def upstream(handler: Handler, pause_s: float = 0.0) -> AsyncIterator[tuple[str, list]]:
    """Serves ``handler(request head)``'s writes, ``pause_s`` before each; yields the base
    URL and the list of requests received (head and body)."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            seen.append(head + await reader.readexactly(int(length.group(1)) if length else 0))
            for chunk in await handler(head):
                await asyncio.sleep(pause_s)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        server.close()


def test_a_server_refusing_the_gateways_key_is_its_setting_to_fix(caplog) -> None:
    """A wrong vllm_api_key never heals by itself: an ERROR naming the setting (it was a
    WARNING, "not ready: answered 401"), and a 503 the SDK is told not to retry."""
    from gateway.errors import error_response

    async def go() -> tuple[bool, BaseException]:
        refused = answer({"error": "Unauthorized"}, "401 Unauthorized")
        async with upstream(lambda head: _replied(refused)) as (url, _):
            engine = VllmEngine(url, "m", api_key="wrong", connect_timeout=2, timeout=5)
            try:
                ready = await engine.ready()
                with pytest.raises(EngineConfigError) as info:
                    await generate_or_stream(engine, streaming=False)
                return ready, info.value
            finally:
                await engine.aclose()

    with caplog.at_level("ERROR"):
        ready, error = asyncio.run(go())
    assert not ready and "set vllm_api_key" in str(error)
    assert any("vllm_api_key" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    response = error_response(error)  # type: ignore[arg-type]
    assert response.status_code == 503 and response.headers["x-should-retry"] == "false"
    assert "Retry-After" not in response.headers


async def _replied(writes: list[bytes]) -> list[bytes]:
    return writes


async def generate_or_stream(engine: VllmEngine, streaming: bool) -> Generation:
    messages, sampling = [ChatMessage("user", "hi")], Sampling(max_tokens=4)
    if not streaming:
        return await engine.generate(messages, None, sampling)
    events = [e async for e in engine.stream(messages, None, sampling)]
    assert isinstance(events[-1], Generation)
    return events[-1]


def models_or(reply: list[bytes]) -> Handler:
    """/v1/models lists model "m" (context window 64); every other request gets ``reply``."""

    async def handle(head: bytes) -> list[bytes]:
        if head.startswith(b"GET /v1/models "):
            return answer({"data": [{"id": "m", "max_model_len": 64}]})
        return reply

    return handle


def test_a_long_non_streaming_answer_is_bounded_by_the_request_timeout_alone() -> None:
    """A non-streaming answer comes in one read once the whole generation is done: the
    per-read bound (`timeout`) would cut off every generation longer than it. A stream that
    stalls between chunks for that long is still cut off."""

    async def go() -> None:
        reply = models_or(answer(completion({"prompt_tokens": 3, "completion_tokens": 1})))
        async with upstream(reply, pause_s=1.5) as (url, _):
            engine = VllmEngine(url, "m", timeout=0.5, request_timeout=30)
            try:
                assert (await generate_or_stream(engine, streaming=False)).text == "ok"
            finally:
                await engine.aclose()
        stalled = models_or(sse({"choices": [{"delta": {"content": "o"}}]}))
        async with upstream(stalled, pause_s=1.5) as (url, _):
            engine = VllmEngine(url, "m", timeout=0.5, request_timeout=30)
            engine._limits_due = math.inf  # the models request would time out first
            try:
                with pytest.raises(EngineUnavailable, match="timed out"):
                    await generate_or_stream(engine, streaming=True)
            finally:
                await engine.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": 1},
        {"prompt_tokens": 1.9e300, "completion_tokens": 1},
        {"prompt_tokens": 3, "completion_tokens": 2**40},
        {"prompt_tokens": "3", "completion_tokens": 1},
        {"prompt_tokens": 3, "completion_tokens": True},
        {"prompt_tokens": 3.0, "completion_tokens": 1},
        [3, 1],
    ],
    ids=["negative", "huge-float", "huge-int", "string", "bool", "float", "not-an-object"],
)
def test_usage_that_is_no_token_count_is_engine_unavailable(usage: Any, streaming: bool) -> None:
    """Usage goes into Prometheus counters (no negatives) and into sealed receipts (no
    1.9e300): an upstream breaking its contract is a 503 with nothing recorded, not a 500."""

    async def go() -> None:
        reply = answer(completion(usage))
        if streaming:
            chunk = {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}
            reply = sse(chunk, {"choices": [], "usage": usage})
        async with upstream(models_or(reply)) as (url, _), VllmEngine(url, "m") as engine:
            with pytest.raises(EngineUnavailable, match="usage"):
                await generate_or_stream(engine, streaming)

    asyncio.run(go())


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_usage_not_sent_counts_zero(streaming: bool) -> None:
    async def go() -> Generation:
        reply = answer(completion())
        if streaming:
            reply = sse({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]})
        async with upstream(models_or(reply)) as (url, _), VllmEngine(url, "m") as engine:
            return await generate_or_stream(engine, streaming)

    generation = asyncio.run(go())
    assert (generation.prompt_tokens, generation.completion_tokens) == (0, 0)


def test_a_redirect_is_not_followed() -> None:
    """A 302 from the vLLM URL must not carry the request, and the vLLM API key, elsewhere."""

    async def go() -> list[bytes]:
        reply = answer(completion({"prompt_tokens": 3, "completion_tokens": 1}))
        async with upstream(models_or(reply)) as (elsewhere, reached):

            async def redirect(head: bytes) -> list[bytes]:
                path = head.split()[1].decode()
                return answer({}, "302 Found", f"Location: {elsewhere}{path}\r\n")

            async with upstream(redirect) as (url, _), VllmEngine(url, "m", api_key="k") as engine:
                with pytest.raises(EngineUnavailable, match="302, a redirect"):
                    await generate_or_stream(engine, streaming=False)
                assert await engine.ready() is False
            return reached

    assert asyncio.run(go()) == []


def test_max_tokens_is_lowered_to_the_context_window_the_server_lists() -> None:
    """vLLM refuses a max_tokens over max_model_len outright (400); the embedded engine
    lowers it, and so does this engine once /v1/models has told it the window (64 here)."""
    hi = [ChatMessage("user", "hi")]

    async def go() -> list[bytes]:
        async with upstream(models_or(answer(completion()))) as (url, seen):
            async with VllmEngine(url, "m") as engine:
                await engine.generate(hi, None, Sampling(max_tokens=65))
                await engine.generate(hi, None, Sampling(max_tokens=9))
            return seen

    models, lowered, kept = asyncio.run(go())
    assert models.startswith(b"GET /v1/models ")  # once: the window is known from then on
    sent = [json.loads(r.partition(b"\r\n\r\n")[2])["max_tokens"] for r in (lowered, kept)]
    assert sent == [64, 9]


def test_vllms_error_message_is_bounded_before_it_reaches_the_agent() -> None:
    """Raw bodies were cut at 2,000 characters, vLLM's own error.message was not."""
    long = "x" * 100_000
    for raw in (
        json.dumps({"error": {"message": long}}),
        json.dumps({"detail": long}),
        json.dumps({"message": long}),
        long,
    ):
        error = status_error(400, raw.encode())
        assert isinstance(error, EngineRejected) and len(error.message) == 2000


def window_server(windows: list[int], replies: list[list[bytes]]) -> Handler:
    """/v1/models lists model "m" with the next of ``windows`` (the last one stays); each
    other request gets the next of ``replies``."""

    async def handle(head: bytes) -> list[bytes]:
        if head.startswith(b"GET /v1/models "):
            window = windows.pop(0) if len(windows) > 1 else windows[0]
            return answer({"data": [{"id": "m", "max_model_len": window}]})
        return replies.pop(0)

    return handle


def sent_max_tokens(seen: list[bytes]) -> list[int | str]:
    """What each request asked: max_tokens for a completion, "models" for /v1/models."""
    return [
        "models"
        if r.startswith(b"GET /v1/models ")
        else json.loads(r.partition(b"\r\n\r\n")[2])["max_tokens"]
        for r in seen
    ]


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_a_server_restarted_with_a_smaller_window_is_asked_again(streaming: bool) -> None:
    """vLLM restarted with --max-model-len 1024 (was 2048) between two requests: it refused
    max_tokens=1500 ("cannot be greater than max_model_len=1024", a 400 that reached the
    agent) where docs/api.md promises it lowered. The engine learns the window again and
    sends the request once more; a request that fits costs no extra round trip."""
    too_many = answer(
        {
            "error": {
                "message": "max_tokens=1500 cannot be greater than max_model_len=1024. Please"
                " request fewer output tokens. (parameter=max_tokens, value=1500)",
                "type": "BadRequestError",
                "param": "max_tokens",
                "code": 400,
            }
        },
        status="400 Bad Request",
    )
    ok = sse(completion()) if streaming else answer(completion())
    hi = [ChatMessage("user", "hi")]

    async def ask(engine: VllmEngine, max_tokens: int) -> None:
        sampling = Sampling(max_tokens=max_tokens)
        if streaming:
            [_ async for _ in engine.stream(hi, None, sampling)]
        else:
            await engine.generate(hi, None, sampling)

    async def go() -> list[bytes]:
        handler = window_server([2048, 1024], [ok, too_many, ok, ok])
        async with upstream(handler) as (url, seen), VllmEngine(url, "m") as engine:
            await ask(engine, 9)
            await ask(engine, 1500)
            await ask(engine, 1500)
            return seen

    assert sent_max_tokens(asyncio.run(go())) == ["models", 9, 1500, "models", 1024, 1024]


def test_the_window_is_learned_again_after_the_server_was_unavailable() -> None:
    """A server that failed a request may come back with another window: the next request
    asks /v1/models again (once), instead of the window known before."""
    hi, sampling = [ChatMessage("user", "hi")], Sampling(max_tokens=100)
    down = answer({"error": {"message": "engine dead"}}, status="503 Service Unavailable")

    async def go() -> list[bytes]:
        handler = window_server([64, 32], [answer(completion()), down, *[answer(completion())] * 2])
        async with upstream(handler) as (url, seen), VllmEngine(url, "m") as engine:
            await engine.generate(hi, None, sampling)
            with pytest.raises(EngineUnavailable):
                await engine.generate(hi, None, sampling)
            await engine.generate(hi, None, sampling)
            await engine.generate(hi, None, sampling)
            return seen

    assert sent_max_tokens(asyncio.run(go())) == ["models", 64, 64, "models", 32, 32]
