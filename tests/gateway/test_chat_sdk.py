"""The real OpenAI SDK against a running gateway: tool calling, streaming, parse, agent loops.

Tool parameters use enums and closed objects so the small model finishes within a few dozen
tokens; everything the model emits is still constrained and checked here against the schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import secrets
import threading
from typing import Any, Literal

import jsonschema
import openai
import pytest
import regex
from pydantic import BaseModel

from gateway import sse
from receipts.errors import LedgerUnavailable
from runtime.engines.base import Generation

pytestmark = pytest.mark.model

CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")
RECEIPT_ID = re.compile(r"^rcpt_[0-9a-f]{24}$")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for one city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET", "JST"]}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
ONE_CALL: dict[str, Any] = {  # exactly one greedy tool call
    "messages": ASK_WEATHER,
    "tools": TOOLS,
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "temperature": 0,
}


def check_calls(tool_calls: list[Any]) -> None:
    """Every call has a call_<24 hex> id and arguments valid against its tool's schema."""
    assert tool_calls, "expected at least one tool call"
    for call in tool_calls:
        assert CALL_ID.match(call.id), call.id
        assert call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
    assert len({c.id for c in tool_calls}) == len(tool_calls)


def receipt_of(completion: Any) -> dict[str, Any]:
    receipt = completion.model_extra["receipt"]
    assert RECEIPT_ID.match(receipt["id"])
    return receipt


def recorded(gateway: Any, receipt_id: str) -> Any:
    stored = gateway.ledger.get(gateway.tenant, receipt_id)
    assert stored is not None, f"receipt {receipt_id} is not in the ledger"
    return stored


def create(gateway: Any, **params: Any) -> Any:
    params.setdefault("messages", ASK_WEATHER)
    params.setdefault("temperature", 0)
    return gateway.openai().chat.completions.create(model=gateway.model, **params)


def test_required_tool_call_is_receipted_before_it_returns(gateway: Any) -> None:
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model=gateway.model,
        **ONE_CALL,
    )
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    check_calls(choice.message.tool_calls)
    receipt = receipt_of(completion)
    assert raw.headers["X-Callproof-Receipt"] == receipt["id"]
    stored = recorded(gateway, receipt["id"])
    assert (stored.seq, stored.entry_hash, stored.manifest_hash) == (
        receipt["seq"],
        receipt["entry_hash"],
        receipt["manifest_hash"],
    )
    assert [c["id"] for c in stored.tool_calls] == [c.id for c in choice.message.tool_calls]
    assert stored.manifest["model"] == gateway.model
    assert completion.usage.completion_tokens == stored.usage["completion_tokens"]


def test_required_tool_choice_calls_a_tool_even_when_asked_to_chat(gateway: Any) -> None:
    completion = create(
        gateway,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "Say hello."}],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message.tool_calls)


def test_named_tool_choice_calls_exactly_that_tool(gateway: Any) -> None:
    """The question asks for the weather; the named tool is the clock, and the clock it is,
    once: with parallel calls on (the default) the constraint the decoder was held to admits
    one call of the clock and no list of calls."""
    completion = create(
        gateway, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    calls = completion.choices[0].message.tool_calls
    check_calls(calls)
    assert [c.function.name for c in calls] == ["get_time"]
    stored = recorded(gateway, receipt_of(completion)["id"])
    with gateway.http("auditor") as auditor:
        constraint = auditor.get(f"/audit/schemas/{stored.manifest['schema_hash']}").json()
    validator = jsonschema.Draft202012Validator(constraint)
    clock = TWO_CALLS["tool_calls"][1]
    assert validator.is_valid(clock)
    assert not validator.is_valid({"tool_calls": [clock, clock]})
    assert not validator.is_valid(TWO_CALLS["tool_calls"][0])


def test_tool_choice_none_answers_without_calls(gateway: Any) -> None:
    completion = create(
        gateway,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=40,
        messages=[{"role": "user", "content": "Say hello."}],
    )
    choice = completion.choices[0]
    assert not choice.message.tool_calls
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    stored = recorded(gateway, receipt_of(completion)["id"])
    assert stored.output["kind"] == "text" and stored.output["tool_calls"] == []
    assert stored.manifest["constraint_kind"] == "none"  # a message, as without tools
    # no hidden {"answer": ...} wrapper: a stop string or two tokens mean what they say
    short = create(gateway, tools=TOOLS, tool_choice="none", max_tokens=2, stop=["answer"])
    assert short.choices[0].message.content and short.usage.completion_tokens <= 2


def test_tool_choice_auto_gives_a_valid_call_or_an_answer(gateway: Any) -> None:
    completion = create(gateway, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False)
    message = completion.choices[0].message
    if message.tool_calls:
        check_calls(message.tool_calls)
        assert completion.choices[0].finish_reason == "tool_calls"
    else:
        assert isinstance(message.content, str)
    assert recorded(gateway, receipt_of(completion)["id"]).output["kind"] in (
        "tool_calls",
        "answer",
    )


TWO_CALLS = {
    "tool_calls": [
        {"tool": "get_weather", "arguments": {"city": "Paris"}},
        {"tool": "get_time", "arguments": {"timezone": "UTC"}},
    ]
}


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls(gateway: Any, parallel: bool) -> None:
    """The small model rarely chooses two calls, so what parallel_tool_calls changes is
    checked where it acts: the constraint the decoder was held to (recorded by its hash)
    admits a list of calls only when parallel calls are allowed."""
    completion = create(
        gateway,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        max_tokens=96,
        messages=[{"role": "user", "content": "Weather in Paris and the time in UTC?"}],
    )
    calls = completion.choices[0].message.tool_calls
    check_calls(calls)
    if not parallel:
        assert len(calls) == 1
    stored = recorded(gateway, receipt_of(completion)["id"])
    assert [c["id"] for c in stored.tool_calls] == [c.id for c in calls]
    with gateway.http("auditor") as auditor:
        constraint = auditor.get(f"/audit/schemas/{stored.manifest['schema_hash']}").json()
    validator = jsonschema.Draft202012Validator(constraint)
    assert validator.is_valid(TWO_CALLS) is parallel
    assert validator.is_valid(TWO_CALLS["tool_calls"][0])


def test_allowed_tools_hold_the_calls_to_those_tools(gateway: Any) -> None:
    """OpenAI's allowed_tools: asked about the weather with only get_time allowed, the model
    calls get_time (the decoder cannot write another), and the receipt binds that schema."""
    allowed = {
        "mode": "required",
        "tools": [{"type": "function", "function": {"name": "get_time"}}],
    }
    completion = create(
        gateway,
        **{**ONE_CALL, "tool_choice": {"type": "allowed_tools", "allowed_tools": allowed}},
    )
    calls = completion.choices[0].message.tool_calls
    check_calls(calls)
    assert {c.function.name for c in calls} == {"get_time"}
    stored = recorded(gateway, receipt_of(completion)["id"])
    bound = json.dumps(gateway.ledger.schema(stored.manifest["schema_hash"]))
    assert "get_time" in bound and "get_weather" not in bound


def test_streamed_tool_call_is_reassembled_by_the_sdk(gateway: Any) -> None:
    client = gateway.openai()
    with client.chat.completions.stream(
        model=gateway.model,
        **ONE_CALL,
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    check_calls(final.choices[0].message.tool_calls)
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.choices[0].message.content is None  # as without streaming, and on OpenAI
    assert chunks[0].choices[0].delta.role == "assistant"
    first_call = next(c for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    delta = first_call.choices[0].delta.tool_calls[0]
    assert (delta.index, delta.type) == (0, "function") and CALL_ID.match(delta.id)
    receipt = chunks[-1].model_extra["receipt"]
    stored = recorded(gateway, receipt["id"])
    assert [c["id"] for c in stored.tool_calls] == [
        c.id for c in final.choices[0].message.tool_calls
    ]
    assert (stored.seq, stored.entry_hash, stored.manifest_hash) == (
        receipt["seq"],
        receipt["entry_hash"],
        receipt["manifest_hash"],
    )


def test_a_held_tool_call_keeps_the_stream_alive(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tool calls are held until their receipt commits, and nothing else is sent meanwhile:
    comment lines keep a client's read timeout or a proxy's idle timeout from cutting the
    stream. At an interval of 0 each held token sends one; the SDK skips them."""
    monkeypatch.setattr(sse, "KEEPALIVE_S", 0.0)
    body = {"model": gateway.model, "stream": True, **ONE_CALL}
    with (
        gateway.http("agent") as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = [line for line in response.iter_lines() if line]
    comments = [i for i, line in enumerate(lines) if line.startswith(":")]
    first_call = next(i for i, line in enumerate(lines) if '"tool_calls"' in line)
    assert comments and max(comments) < first_call, lines
    assert {lines[i] for i in comments} == {": keep-alive"}
    with gateway.openai().chat.completions.stream(model=gateway.model, **ONE_CALL) as stream:
        final = stream.get_final_completion()
    check_calls(final.choices[0].message.tool_calls)


def test_streamed_answer_with_usage_chunk(gateway: Any) -> None:
    stream = create(
        gateway,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=12,
        messages=[{"role": "user", "content": "Count to five."}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes in (["stop"], ["length"])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    stored = recorded(gateway, last.model_extra["receipt"]["id"])
    assert stored.output["kind"] == "text" and stored.output["content_sha256"]


def test_chunks_carry_the_fields_openai_sends(gateway: Any) -> None:
    """Field by field as OpenAI's stream: the role chunk has content "" and refusal null;
    system_fingerprint is in every chunk, the same as a whole answer's; with include_usage
    every chunk but the usage chunk has usage null, and without it there is no usage key."""
    answer = create(gateway, messages=[{"role": "user", "content": "Hi."}], max_tokens=1)
    fingerprint = answer.system_fingerprint
    assert re.fullmatch(r"fp_[0-9a-f]{10}", fingerprint), fingerprint
    body = {
        "model": gateway.model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 3,
        "stream": True,
    }
    for include_usage in (True, False):
        options = {"stream_options": {"include_usage": True}} if include_usage else {}
        with gateway.http("agent") as client:
            raw = client.post("/v1/chat/completions", json={**body, **options}).text
        events = [line[len("data: ") :] for line in raw.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {
            "role": "assistant",
            "content": "",
            "refusal": None,
        }
        assert {c["system_fingerprint"] for c in chunks} == {fingerprint}
        assert len({c["id"] for c in chunks}) == 1
        if include_usage:
            assert all(c["usage"] is None for c in chunks[:-1])
            assert chunks[-1]["usage"]["total_tokens"] > 0 and chunks[-1]["choices"] == []
        else:
            assert not any("usage" in c for c in chunks)
        assert "receipt" in chunks[-1] and not any("receipt" in c for c in chunks[:-1])


def test_seed_and_top_p_make_a_sampled_answer_repeatable(gateway: Any) -> None:
    """At temperature 1 the seed decides the sample: the same seed gives the same text, other
    seeds other texts, and the receipt records the sampling that made it."""
    params: dict[str, Any] = {
        "temperature": 1.0,
        "top_p": 0.95,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
    }
    texts = {seed: create(gateway, seed=seed, **params) for seed in (7, 8, 9)}
    again = create(gateway, seed=7, **params)
    assert again.choices[0].message.content == texts[7].choices[0].message.content
    assert len({c.choices[0].message.content for c in texts.values()}) > 1
    sampling = recorded(gateway, receipt_of(again)["id"]).manifest["sampling"]
    assert (sampling["seed"], sampling["temperature"], sampling["top_p"]) == (7, 1.0, 0.95)


def test_top_p_zero_samples_the_likeliest_token_alone(gateway: Any) -> None:
    """OpenAI's range for top_p includes 0 (vLLM's does not): the nucleus is the likeliest
    token, so every seed gives the greedy answer, and the receipt records the 0 asked for."""
    params: dict[str, Any] = {
        "max_tokens": 12,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
    }
    greedy = create(gateway, **params).choices[0].message.content
    for seed in (7, 8):
        sampled = create(gateway, temperature=1.0, top_p=0, seed=seed, **params)
        assert sampled.choices[0].message.content == greedy
    assert recorded(gateway, receipt_of(sampled)["id"]).manifest["sampling"]["top_p"] == 0


def test_json_object_and_text_response_formats(gateway: Any) -> None:
    as_json = create(
        gateway,
        response_format={"type": "json_object"},
        max_tokens=64,
        messages=[{"role": "user", "content": "Give Paris's country as JSON."}],
    )
    assert isinstance(json.loads(as_json.choices[0].message.content), dict)
    assert recorded(gateway, receipt_of(as_json)["id"]).manifest["constraint_kind"] == "json"
    as_text = create(
        gateway,
        response_format={"type": "text"},
        max_tokens=8,
        messages=[{"role": "user", "content": "Say hi."}],
    )
    assert isinstance(as_text.choices[0].message.content, str)
    assert recorded(gateway, receipt_of(as_text)["id"]).manifest["constraint_kind"] == "none"


class CityFact(BaseModel):
    city: Literal["Paris", "Tokyo", "Lima"]
    country: Literal["France", "Japan", "Peru"]


def test_parse_with_a_pydantic_response_format(gateway: Any) -> None:
    completion = gateway.openai().chat.completions.parse(
        model=gateway.model,
        response_format=CityFact,
        temperature=0,
        max_tokens=40,
        messages=[{"role": "user", "content": "Which country is Tokyo in?"}],
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, CityFact)
    stored = recorded(gateway, receipt_of(completion)["id"])
    assert stored.output["kind"] == "parsed" and stored.manifest["schema_hash"]


def test_the_response_formats_description_reaches_the_model(gateway: Any) -> None:
    """pydantic-ai's NativeOutput moves the output model's docstring into
    json_schema.description, which OpenAI's model reads "to determine how to respond in the
    format": it is in the prompt (more prompt tokens), beside tools too, and the receipt
    keeps it with the rest of the request. Beside tools on the embedded engine only: the
    prompt is the gateway's on either engine, and on the vLLM CPU build of 2026-11-25 greedy
    decoding of this request ran away in a string (a 422 at max_tokens 60 and 200, on the
    build before as well), which says nothing about the prompt."""
    schema = {"name": "CityFact", "schema": CityFact.model_json_schema(), "strict": True}
    purpose = "Name the city the user asks about and the country it is in."
    beside_tools = [{"tools": TOOLS}] if gateway.engine.identity.engine != "vllm" else []
    for tools in ({}, *beside_tools):
        plain, told = (
            create(
                gateway,
                response_format={"type": "json_schema", "json_schema": json_schema},
                max_tokens=60,
                messages=[{"role": "user", "content": "Which country is Tokyo in?"}],
                **tools,
            )
            for json_schema in (schema, {**schema, "description": purpose})
        )
        assert told.usage.prompt_tokens > plain.usage.prompt_tokens + 10, tools
        sent = recorded(gateway, receipt_of(told)["id"]).request["payload_json"]["params"]
        assert json.loads(sent)["response_format"]["json_schema"]["description"] == purpose


def test_two_turn_agent_loop_links_the_receipts(gateway: Any) -> None:
    client = gateway.openai()
    first = create(gateway, **ONE_CALL)
    call = first.choices[0].message.tool_calls[0]
    check_calls([call])
    second = client.chat.completions.create(
        model=gateway.model,
        temperature=0,
        max_tokens=40,
        tools=TOOLS,
        tool_choice="none",
        messages=[
            *ASK_WEATHER,
            first.choices[0].message.model_dump(),  # as echoed: refusal, audio... null
            {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21, "sky": "clear"}'},
        ],
    )
    assert second.choices[0].message.content
    answer = recorded(gateway, receipt_of(second)["id"])
    assert answer.links == [{"tool_call_id": call.id, "receipt_id": receipt_of(first)["id"]}]
    with gateway.http("auditor") as auditor:
        found = auditor.get(f"/audit/calls/{call.id}").json()
    assert found["receipt"]["id"] == receipt_of(first)["id"]
    assert [r["id"] for r in found["answered_by"]] == [answer.id]


def test_an_assistant_refusal_reads_the_same_however_it_is_written(gateway: Any) -> None:
    """An SDK message may carry an assistant's refusal as its `refusal` member or as a
    content part of type refusal (ChatCompletionContentPartRefusalParam); either is what
    that turn said, the same prompt as that text written as content."""
    said = "I can't help with that."
    spellings = (
        {"content": said},
        {"content": None, "refusal": said},
        {"content": [{"type": "refusal", "refusal": said}]},
    )
    prompt_tokens = set()
    for spelling in spellings:
        completion = gateway.openai().chat.completions.create(
            model=gateway.model,
            max_tokens=1,
            messages=[
                {"role": "user", "content": "How do I pick a lock?"},
                {"role": "assistant", **spelling},
                {"role": "user", "content": "Then say hi."},
            ],
        )
        prompt_tokens.add(completion.usage.prompt_tokens)
    assert len(prompt_tokens) == 1, prompt_tokens


@pytest.mark.parametrize("shape", ["call_", "toolu_"])
def test_unknown_tool_call_id_is_recorded_unlinked(gateway: Any, shape: str) -> None:
    """A result for a call the gateway never issued (its own id shape, or another provider's
    in a history carried over) is recorded unlinked, and the auditor finds it by that id."""
    ghost = shape + secrets.token_hex(12)
    completion = create(
        gateway,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=24,
        messages=[
            *ASK_WEATHER,
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": ghost,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": ghost, "content": "sunny"},
        ],
    )
    stored = recorded(gateway, receipt_of(completion)["id"])
    assert stored.links == [{"tool_call_id": ghost, "receipt_id": None}]
    with gateway.http("auditor") as client:
        listed = client.get("/audit/receipts", params={"answering": ghost})
    assert listed.status_code == 200, listed.text
    assert [r["id"] for r in listed.json()["items"]] == [stored.id]


def test_a_call_resent_with_arguments_that_are_no_json_object_is_answered(gateway: Any) -> None:
    """LangChain re-sends an invalid call's raw arguments, and OpenAI types them as any
    string: a history holding a call cut off mid-arguments is answered (it was a 400), and
    its tool result still links to the receipt that issued the call."""
    first = create(gateway, **ONE_CALL)
    issued = first.choices[0].message.model_dump()
    call = issued["tool_calls"][0]
    call["function"]["arguments"] = call["function"]["arguments"][:-3]  # cut off
    second = create(
        gateway,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=8,
        messages=[
            *ASK_WEATHER,
            issued,
            {"role": "tool", "tool_call_id": call["id"], "content": "error: arguments invalid"},
        ],
    )
    assert second.choices[0].message.content is not None
    answer = recorded(gateway, receipt_of(second)["id"])
    assert answer.links == [{"tool_call_id": call["id"], "receipt_id": receipt_of(first)["id"]}]


def the_answer_turn(gateway: Any, first: Any, **params: Any) -> Any:
    """An agent's next turn after ``first`` (one call): the call, its result, no more calls."""
    call = first.choices[0].message.tool_calls[0]
    return create(
        gateway,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=8,
        messages=[
            *ASK_WEATHER,
            first.choices[0].message.model_dump(),
            {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'},
        ],
        **params,
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_results_are_linked_while_the_engine_generates(
    gateway: Any, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The receipts that issued the answered calls are read while the engine works, not
    after it (a database read off the answer's path). The engine here does not finish before
    that read has begun: a gateway reading links only after generating would fail this."""
    first = create(gateway, **ONE_CALL)
    call = first.choices[0].message.tool_calls[0]
    reading = threading.Event()
    issuers, generate, engine_stream = (
        gateway.ledger.issuers,
        gateway.engine.generate,
        gateway.engine.stream,
    )

    def issuers_noted(tenant: str, call_ids: Any) -> dict[str, str]:
        reading.set()
        return issuers(tenant, call_ids)

    async def links_under_way() -> None:
        began = await asyncio.to_thread(reading.wait, 30)
        assert began, "the engine finished before the links were read"

    async def generate_after_links(*args: Any, **kwargs: Any) -> Any:
        await links_under_way()
        return await generate(*args, **kwargs)

    async def stream_after_links(*args: Any, **kwargs: Any) -> Any:
        async with contextlib.aclosing(engine_stream(*args, **kwargs)) as events:
            async for item in events:
                if isinstance(item, Generation):  # the last event: the engine is done
                    await links_under_way()
                yield item

    monkeypatch.setattr(gateway.ledger, "issuers", issuers_noted)
    monkeypatch.setattr(gateway.engine, "generate", generate_after_links)
    monkeypatch.setattr(gateway.engine, "stream", stream_after_links)
    second = the_answer_turn(gateway, first, stream=stream)
    ref = list(second)[-1].model_extra["receipt"] if stream else receipt_of(second)
    assert recorded(gateway, ref["id"]).links == [
        {"tool_call_id": call.id, "receipt_id": receipt_of(first)["id"]}
    ]


def test_links_are_read_again_if_the_database_was_down_when_generation_began(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The links are read as the engine starts; a database down then (a failover) and back
    by the time the receipt is sealed costs a second read, not a 503 for the whole answer."""
    first = create(gateway, **ONE_CALL)
    call = first.choices[0].message.tool_calls[0]
    issuers, reads = gateway.ledger.issuers, []

    def down_at_first(tenant: str, call_ids: Any) -> dict[str, str]:
        reads.append(tuple(call_ids))
        if len(reads) == 1:
            raise LedgerUnavailable("the ledger database is unavailable: failing over")
        return issuers(tenant, call_ids)

    monkeypatch.setattr(gateway.ledger, "issuers", down_at_first)
    second = the_answer_turn(gateway, first)
    assert reads == [(call.id,), (call.id,)]
    assert recorded(gateway, receipt_of(second)["id"]).links == [
        {"tool_call_id": call.id, "receipt_id": receipt_of(first)["id"]}
    ]


def test_regex_and_grammar_extensions_through_extra_body(gateway: Any) -> None:
    by_regex = create(
        gateway,
        messages=[{"role": "user", "content": "Is Paris in France?"}],
        max_tokens=8,
        extra_body={"regex": "(yes|no)"},
    )
    assert by_regex.choices[0].message.content in ("yes", "no")
    stored = recorded(gateway, receipt_of(by_regex)["id"])
    assert stored.manifest["constraint_kind"] == "regex" and stored.manifest["schema_hash"] is None
    grammar = 'root ::= "Paris" | "Tokyo" | "Lima"'
    by_grammar = create(
        gateway,
        messages=[{"role": "user", "content": "Name a city."}],
        max_tokens=8,
        extra_body={"grammar": grammar},
    )
    assert by_grammar.choices[0].message.content in ("Paris", "Tokyo", "Lima")


def test_unicode_property_escapes_in_a_tool_schema_are_enforced(gateway: Any) -> None:
    """JSON Schema patterns are ECMA regexes: \\p{Lu} and \\p{Ll} are an upper- and a
    lower-case letter of any script (Python's ``re`` has no such escape)."""
    pattern = "^\\p{Lu}\\p{Ll}{1,15}$"
    with pytest.raises(openai.BadRequestError) as refused:
        create(gateway, extra_body={"regex": "\\p{Lettre}+"}, max_tokens=4)
    assert refused.value.body["code"] == "invalid_regex"
    assert "unknown Unicode property" in refused.value.body["message"]
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "pattern": pattern}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    params: dict[str, Any] = {
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "What is the weather in Zürich?"}],
    }
    completion = create(gateway, **params)
    (call,) = completion.choices[0].message.tool_calls
    assert regex.fullmatch(pattern, json.loads(call.function.arguments)["city"])
    if "llguidance" not in gateway.engine.identity.backends:
        # vLLM's xgrammar refused the escape (a 400 that named no keyword): the pattern is
        # left out of what the server enforces and checked after decoding (a 422 if broken)
        stored = recorded(gateway, receipt_of(completion)["id"])
        assert stored.fallback == "post_hoc_check:pattern"


def test_a_cut_off_answer_comes_back_as_far_as_it_got(gateway: Any) -> None:
    """As OpenAI returns it: finish_reason "length" and the text so far, streamed or not,
    also when tools are bound; the receipt records it and claims no conformance."""
    params: dict[str, Any] = {
        "tools": TOOLS,
        "tool_choice": "auto",  # the answer inside the tool envelope (greedily, no call)
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "Hi! How are you?"}],
    }
    completion = create(gateway, **params)
    choice = completion.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content
    stored = recorded(gateway, receipt_of(completion)["id"])
    assert (stored.finish_reason, stored.output["kind"]) == ("length", "answer")
    assert (
        stored.output["content_sha256"]
        == hashlib.sha256(choice.message.content.encode()).hexdigest()
    )
    assert stored.validation == {
        "valid": False,
        "errors": ["cut off by the token limit before the constraint was satisfied"],
    }
    chunks = list(create(gateway, stream=True, **params))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


def test_an_answer_cut_off_before_its_text_began_is_empty_not_an_error(gateway: Any) -> None:
    """A token limit that ends the output inside the tool envelope's syntax (`{"answer":`)
    leaves nothing said: 200 with finish_reason "length", as OpenAI answers a tiny
    max_tokens, and no tool call. Where calls are required there is no answer to give: 422."""
    params: dict[str, Any] = {
        "tools": TOOLS,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "Hi! How are you?"}],
    }
    choice = create(gateway, tool_choice="auto", **params).choices[0]
    assert (choice.finish_reason, choice.message.content) == ("length", "")
    assert not choice.message.tool_calls
    chunks = list(create(gateway, tool_choice="auto", stream=True, **params))
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    assert [
        c.choices[0].delta.content for c in chunks if c.choices[0].delta.content is not None
    ] == [""]  # the answer's "", as a whole answer says it (the role chunk's content is null)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        create(gateway, tool_choice="required", **params)
    assert refused.value.body["param"] == "max_tokens"


def test_a_stop_string_ends_an_answer_like_openai(gateway: Any) -> None:
    """The answer up to the stop string, finish_reason "stop", not an error."""
    completion = create(
        gateway,
        tools=TOOLS,
        tool_choice="auto",  # the answer inside the tool envelope
        stop=["o"],
        max_tokens=40,
        messages=[{"role": "user", "content": "Say hello to the world."}],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and "o" not in choice.message.content
    stored = recorded(gateway, receipt_of(completion)["id"])
    assert stored.validation["errors"] == [
        "cut off by the stop string 'o' before the constraint was satisfied"
    ]


def test_parse_of_a_cut_off_answer_raises_the_sdks_length_error(gateway: Any) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        gateway.openai().chat.completions.parse(
            model=gateway.model,
            response_format=CityFact,
            temperature=0,
            max_tokens=3,
            messages=[{"role": "user", "content": "Which country is Tokyo in?"}],
        )


def test_stream_null_is_not_streamed(gateway: Any) -> None:
    """The SDK's own type is `stream: Optional[Literal[False]]`; OpenAI takes null as false."""
    completion = create(
        gateway, stream=None, max_tokens=4, extra_body={"regex": "(yes|no)"}, messages=ASK_WEATHER
    )
    assert completion.choices[0].message.content in ("yes", "no")
    receipt_of(completion)
