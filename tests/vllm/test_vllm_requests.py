"""What VllmEngine sends, without a server: the request body and the structured-outputs field
for every constraint kind and enforcement mode. Structural tags are also compiled by xgrammar
(the library vLLM hands them to), so a tag vLLM would reject fails here first."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import jsonschema
import pytest
import xgrammar

from runtime.constraint import Constraint
from runtime.engines.base import ChatMessage, Sampling
from runtime.engines.vllm import (
    VllmEngine,
    _json,
    _status_error,
    structured_outputs,
)
from runtime.errors import EngineRejected, EngineUnavailable
from runtime.thinking import Enforcement
from runtime.tools import parse_tools_field, union_schema

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
    engine = VllmEngine("http://vllm:8000/", "served-name")
    sampling = Sampling(temperature=0.5, top_p=0.9, max_tokens=7, seed=3, stop=("\n",))
    body = engine.request_body(
        [ChatMessage("system", "s"), ChatMessage("user", "u")],
        Constraint.regex("[a-z]+"),
        sampling,
        stream=True,
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
    free = engine.request_body([ChatMessage("user", "u")], None, Sampling(), stream=False)
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
    engine = VllmEngine("http://vllm:8000", "m", backend="guidance")
    body = engine.request_body([ChatMessage("user", "u")], union(), Sampling(), stream=False)
    assert "json" in body["structured_outputs"]  # plain constraints work on any backend
    with pytest.raises(EngineUnavailable, match="xgrammar"):
        engine.request_body(
            [ChatMessage("user", "u")], union(), Sampling(), Enforcement("triggered"), stream=False
        )


@pytest.mark.parametrize(
    "raw",
    [b"", b"<html>bad gateway</html>", b'{"text": "\xff"}', b"[1, 2]"],
    ids=["empty", "html", "bad-utf8", "not-an-object"],
)
def test_an_upstream_body_that_is_not_a_json_object_is_engine_unavailable(raw: bytes) -> None:
    """What a broken proxy in front of vLLM may send: a 503 naming the engine, not a 500."""
    with pytest.raises(EngineUnavailable, match="the vLLM server sent"):
        _json(raw)


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
    error = _status_error(500, b'{"error": {"message": "Traceback ... /srv/vllm/engine.py"}}')
    assert isinstance(error, EngineUnavailable)
    assert str(error) == "the vLLM server answered 500"
    assert isinstance(_status_error(400, b'{"error": {"message": "bad n"}}'), EngineRejected)
