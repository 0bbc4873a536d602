"""Every refusal is fast, in OpenAI's error shape, and names what is wrong.

Most cases fail before the model runs; they go through the real SDK where the SDK can send
the request (so its exception classes are checked too) and through raw HTTP where it cannot.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import error_of, fresh_gateway

from receipts.queries import ReceiptQuery


def function_tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI ``tools[]`` item."""
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOL = function_tool(
    "lookup",
    {
        "type": "object",
        "properties": {"q": {"type": "string", "enum": ["a", "b"]}},
        "required": ["q"],
        "additionalProperties": False,
    },
)
HELLO = [{"role": "user", "content": "hello"}]


def post_chat(gateway: Any, role: str | None = "agent", **body: Any) -> Any:
    body.setdefault("model", gateway.model)
    body.setdefault("messages", HELLO)
    with gateway.http(role) as client:
        return client.post("/v1/chat/completions", json=body)


def sdk_error(gateway: Any, **params: Any) -> openai.APIStatusError:
    params.setdefault("messages", HELLO)
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.openai().chat.completions.create(model=gateway.model, **params)
    return caught.value


def test_n_other_than_one_is_refused(gateway: Any) -> None:
    err = sdk_error(gateway, n=2)
    assert isinstance(err, openai.BadRequestError)
    assert (err.body["param"], err.body["code"]) == ("n", "unsupported_parameter")
    assert err.body["message"] == "n=2 is not supported here; leave it out or send 1"


def test_unsupported_parameter_is_named(gateway: Any) -> None:
    err = sdk_error(gateway, logprobs=True)
    assert isinstance(err, openai.BadRequestError)
    assert (err.body["param"], err.body["code"]) == ("logprobs", "unsupported_parameter")


def test_conflicting_constraints_name_both(gateway: Any) -> None:
    err = error_of(
        post_chat(
            gateway,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            },
            regex="[a-z]+",
        ),
        400,
    )
    assert err["code"] == "conflicting_constraints"
    assert "regex" in err["message"] and "response_format" in err["message"]


def test_unknown_tool_in_tool_choice(gateway: Any) -> None:
    err = sdk_error(
        gateway, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}
    )
    assert err.status_code == 400 and err.body["code"] == "unknown_tool"
    assert "nope" in err.body["message"]


def test_invalid_tool_schema(gateway: Any) -> None:
    bad = function_tool("bad", {"type": "nonsense"})
    err = error_of(post_chat(gateway, tools=[bad]), 400)
    assert err["code"] in ("invalid_schema", "invalid_tools") and err["param"].startswith("tools")


def test_body_too_large_is_413(gateway: Any) -> None:
    big = "x" * (gateway.settings.max_body_bytes + 1)
    err = error_of(post_chat(gateway, messages=[{"role": "user", "content": big}]), 413)
    assert err["code"] == "body_too_large"


def test_too_many_tools(gateway: Any) -> None:
    many = [
        function_tool(f"t{i}", {"type": "object"}) for i in range(gateway.settings.max_tools + 1)
    ]
    err = error_of(post_chat(gateway, tools=many), 400)
    assert err["code"] == "constraint_too_complex" and "max_tools" in err["message"]


def _deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def test_schema_too_deep(gateway: Any) -> None:
    deep = _deep_schema(gateway.settings.max_schema_depth)
    err = error_of(
        post_chat(
            gateway,
            response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": deep}},
        ),
        400,
    )
    assert err["code"] == "constraint_too_complex" and "max_schema_depth" in err["message"]


def test_schema_too_large(gateway: Any) -> None:
    properties = {f"field_{i:05d}": {"type": "string"} for i in range(3000)}
    err = error_of(
        post_chat(
            gateway,
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "big",
                    "schema": {"type": "object", "properties": properties},
                },
            },
        ),
        400,
    )
    assert err["code"] == "constraint_too_complex" and "max_schema_bytes" in err["message"]


def _linked_defs(count: int) -> dict[str, Any]:
    """A schema of ``count`` $defs each standing for the next: flat as a document, as deep as
    ``count`` nested schemas to a compiler (1,500 crashed llguidance's thread)."""
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]} for i in range(count)
    }
    defs[f"d{count}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _rule_chain(count: int, body: str = "{}") -> str:
    """``count`` rules each naming the next, in ``body`` (where ``{}`` is the reference)."""
    rules = "\n".join(f"r{i}: " + body.format(f"r{i + 1}") for i in range(count))
    return "start: r0\n" + rules + f'\nr{count}: "a"'


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("grammar", _rule_chain(3000), "max_grammar_depth"),  # it crashed the gateway
        # The same chain with each reference beside a literal a naive scan misreads:
        ("grammar", _rule_chain(3000, '/"/ {} /"/'), "max_grammar_depth"),
        ("grammar", _rule_chain(3000, "/x\\// {}"), "max_grammar_depth"),
        ("grammar", _rule_chain(2500, '"%json {{" {} "}}"'), "max_grammar_depth"),
        (
            "grammar",
            "start: %json " + json.dumps(_linked_defs(1200), separators=(",", ":")),
            "max_schema_depth",
        ),
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "c", "schema": _linked_defs(1500)}},
            "max_schema_depth",
        ),
        # the regex module that checks the output recursed past Python's stack: a 500
        ("regex", "(?:" * 200 + "a" + ")" * 200, "nests groups 200 deep"),
        # llguidance's lexer fuel ran out; xgrammar then took 6 s and more, on every new text
        # (on vLLM: a 503 after 5 s, then its SDK retry, while other agents waited)
        ("regex", ".*" * 499 + "b", "max_regex_loops"),
    ],
    ids=[
        "rule-chain",
        "beside-a-quote-in-a-regex",
        "beside-an-escaped-slash",
        "beside-a-json-string",
        "json-in-grammar",
        "ref-chain",
        "nested-groups",
        "side-by-side-stars",
    ],
)
def test_constraints_the_compiler_would_recurse_through_are_refused(
    gateway: Any, field: str, value: Any, words: str
) -> None:
    started = time.perf_counter()
    err = error_of(post_chat(gateway, **{field: value}), 400)
    assert err["code"] == "constraint_too_complex" and words in err["message"], err
    assert time.perf_counter() - started < 3.0  # refused before any compiler saw it
    with gateway.http() as client:
        assert client.get("/healthz").status_code == 200  # the process is still there


def test_schemas_composing_subschemas_many_times_over_are_answered_at_once(gateway: Any) -> None:
    """Two ways an agent's schema made closing its objects slow, on the event loop (every
    other request waited): refs naming the next level twice, read once per path (19 levels:
    2^19 reads, 10 s; then refused as too deep), and 500 objects each composing one wide
    allOf (a second; then refused as too large). Both are now refused at once."""
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2, "properties": {f"p{i}": {}}}
        for i in range(19)
    }
    defs["d19"] = {"type": "object", "properties": {"z": {}}}
    levels = {"type": "object", "allOf": [{"$ref": "#/$defs/d0"}], "properties": {}}
    wide: dict[str, Any] = {f"d{i}": {"required": ["a"]} for i in range(500)}
    wide["hub"] = {"allOf": [{"$ref": f"#/$defs/d{i}"} for i in range(500)]}
    objects = {f"p{j}": {"properties": {}, "allOf": [{"$ref": "#/$defs/hub"}]} for j in range(500)}
    for parameters, words, param in (
        ({**levels, "$defs": defs}, "max_schema_depth", "tools"),  # the union, every tool
        (
            {"type": "object", "properties": objects, "$defs": wide},
            "compose more than 50,000",
            "tools[0].function.parameters",
        ),
    ):
        started = time.perf_counter()
        tools = [function_tool("t", parameters)]
        err = error_of(post_chat(gateway, tools=tools, tool_choice="required"), 400)
        assert time.perf_counter() - started < 5.0  # 10 s and 1 s before; 0.05 s now
        assert err["code"] == "constraint_too_complex" and words in err["message"], err
        assert err["param"] == param


def test_a_huge_schema_is_refused_by_size_before_it_is_checked(gateway: Any) -> None:
    """Its metaschema check took 27 s on the event loop (every request waited), and the
    checked schema stayed cached: the size limit now comes first."""
    import time

    properties = {f"p{i}": {} for i in range(60_000)}
    tool = {
        "type": "function",
        "function": {"name": "big", "parameters": {"type": "object", "properties": properties}},
    }
    started = time.perf_counter()
    err = error_of(post_chat(gateway, tools=[tool]), 400)
    assert time.perf_counter() - started < 5.0  # 27 s before; some 0.2 s of it is sending
    assert err["code"] == "constraint_too_complex" and "max_schema_bytes" in err["message"]
    assert err["param"] == "tools[0].function.parameters"


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"temperature": 1e-300, "max_tokens": 2}, 200, None, None),  # greedy, as vLLM
        ({"top_p": 1e-300, "max_tokens": 2}, 200, None, None),  # the likeliest token
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "loop",
                        "schema": {
                            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                            "$ref": "#/$defs/a",
                        },
                    },
                }
            },
            400,
            "invalid_schema",
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "self",
                        "schema": {
                            "type": "object",
                            "properties": {"a": {"$ref": "#/properties/a"}},
                        },
                    },
                }
            },
            400,
            "invalid_schema",
            "response_format.json_schema.schema",
        ),
        ({"grammar": 'start: <|im_end|> "a"'}, 400, "constraint_unsatisfiable", "grammar"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {
                                    "name": "f",
                                    "arguments": "[" * 1_200 + "]" * 1_200,
                                },
                            }
                        ],
                    }
                ],
                "max_tokens": 1,
            },
            200,  # arguments are any string (OpenAI's type): too deep to read, kept as text
            None,
            None,
        ),
        (
            {"messages": [*HELLO, {"role": "tool", "tool_call_id": "x" * 65, "content": "ok"}]},
            400,
            "invalid_value",
            "messages[1].tool_call_id",
        ),
        ({"stop": ["a" * 257]}, 400, "invalid_value", "stop[0]"),
    ],
    ids=[
        "tiny-temperature",
        "tiny-top-p",
        "ref-loop",
        "self-ref",
        "special-token",
        "deep-args",
        "long-call-id",
        "long-stop",
    ],
)
def test_inputs_that_were_internal_errors(
    gateway: Any, fields: dict[str, Any], status: int, code: str | None, param: str | None
) -> None:
    """Each of these was a 500 (NaN probabilities, a RecursionError) or, for the call id, a
    failed commit of the whole batch on Postgres; nothing is recorded for a refusal."""
    before = gateway.ledger.reach(gateway.tenant)
    response = post_chat(gateway, **fields)
    if status == 200:
        assert response.status_code == 200, response.text
        return
    err = error_of(response, status)
    assert (err["code"], err["param"]) == (code, param), err
    assert gateway.ledger.reach(gateway.tenant) == before


def test_a_time_bound_past_year_9999_in_utc_is_400(gateway: Any) -> None:
    with gateway.http("auditor") as client:
        for params in (
            {"since": "9999-12-31T23:59:59-23:59"},
            {"until": "0001-01-01T00:00:00+23:59"},
        ):
            for path in ("/audit/receipts", "/audit/export"):
                err = error_of(client.get(path, params=params), 400)
                assert err["param"] == next(iter(params)) and "years 1-9999" in err["message"]


def test_many_large_tool_schemas_are_refused_fast(gateway: Any) -> None:
    """Each under max_schema_bytes, together over it: their union is refused. Each was
    checked against its metaschema first, 0.7 s each on the event loop; now 1 ms."""
    import time

    parameters = {"type": "object", "properties": {f"p{i}": {} for i in range(4000)}}
    started = time.perf_counter()
    err = error_of(
        post_chat(gateway, tools=[function_tool(f"t{n}", parameters) for n in range(10)]), 400
    )
    assert time.perf_counter() - started < 5.0  # 7 s before; a loaded machine is slower
    assert err["code"] == "constraint_too_complex" and "max_schema_bytes" in err["message"]
    assert err["param"] == "tools" and "the tools' union schema" in err["message"]


@pytest.mark.parametrize("regex", ["(a+)+b", "a{0,100000}", "(a{100}b){100}"])
def test_regex_too_complex(gateway: Any, regex: str) -> None:
    """``a{,100000}`` once passed the repeat limit, and its pure-Python automaton held a
    grammar worker for minutes: two such requests stalled every constrained call. (Written
    ``{,n}``, it is now refused before the limits: the decoders do not read that form.)"""
    err = error_of(post_chat(gateway, regex=regex), 400)
    assert (err["code"], err["param"]) == ("constraint_too_complex", "regex")


def test_a_repetition_with_no_lower_bound_is_refused_naming_the_form_to_write(
    gateway: Any,
) -> None:
    err = error_of(post_chat(gateway, regex="a{,100000}"), 400)
    assert (err["code"], err["param"]) == ("invalid_regex", "regex")
    assert "write {0,100000}" in err["message"], err


def test_invalid_regex(gateway: Any) -> None:
    err = error_of(post_chat(gateway, regex="(unclosed"), 400)
    assert err["param"] == "regex"


def _answer_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}


@pytest.mark.parametrize(
    ("fields", "code", "param", "says"),
    [
        ({"grammar": "start: foo"}, "invalid_grammar", "grammar", "unknown name"),
        ({"grammar": "root ::= [a-"}, "invalid_grammar", "grammar", "invalid grammar"),
        (
            {"response_format": _answer_schema({"type": "string", "minLength": 5, "maxLength": 2})},
            "constraint_unsatisfiable",
            "response_format",
            "minLength (5) is greater than maxLength (2)",
        ),
        (
            {"response_format": _answer_schema({"enum": []})},
            "constraint_unsatisfiable",
            "response_format",
            "admits no value",
        ),
        # a special token after text: the model wrote it, the returned text dropped it, and
        # the receipt said the output matched its grammar
        (
            {"grammar": 'start: "a" <|im_start|> "system"'},
            "constraint_unsatisfiable",
            "grammar",
            "asks for the special token <|im_start|>",
        ),
        (
            {"grammar": 'start: "a" <[100]>'},
            "constraint_unsatisfiable",
            "grammar",
            "asks for the special token <[100]>",
        ),
    ],
    ids=[
        "unknown-rule",
        "broken-gbnf",
        "min-over-max",
        "empty-enum",
        "special-token-after-text",
        "token-id",
    ],
)
def test_bad_grammars_and_empty_schemas_are_refused_alike_on_every_engine(
    gateway: Any, fields: dict[str, Any], code: str, param: str, says: str
) -> None:
    """vLLM's own answers to these were 400 upstream_rejected with its compiler's words (a
    source path and line of xgrammar's among them); each engine now refuses them alike,
    before any generation, and nothing is recorded."""
    before = gateway.ledger.reach(gateway.tenant)
    err = error_of(post_chat(gateway, **fields), 400)
    assert (err["code"], err["param"]) == (code, param), err
    assert says in err["message"]
    assert gateway.ledger.reach(gateway.tenant) == before


def test_a_grammar_spelling_a_special_token_writes_it_as_text_on_every_engine(
    gateway: Any,
) -> None:
    """A string literal is text, even one that reads like an end-of-turn marker: the embedded
    engine's first backend forced it as the special token and then refused it (a 500)."""
    response = post_chat(gateway, grammar='root ::= "<|im_start|>" "b"', temperature=0)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "<|im_start|>b"


@pytest.mark.parametrize(("stop", "param"), [("", "stop"), (["\n", ""], "stop[1]")])
def test_an_empty_stop_string_is_400_on_every_engine(gateway: Any, stop: Any, param: str) -> None:
    """vLLM refused it with its own words and no param; the embedded engine took it."""
    err = error_of(post_chat(gateway, stop=stop), 400)
    assert (err["code"], err["param"]) == ("invalid_value", param), err


def test_unknown_model_is_404(gateway: Any) -> None:
    err = error_of(post_chat(gateway, model="gpt-unknown"), 404)
    assert (err["code"], err["param"]) == ("model_not_found", "model")


def test_models_retrieve_names_the_served_model_and_404s_others(gateway: Any) -> None:
    client = gateway.openai()
    card = client.models.retrieve(gateway.model)
    assert (card.id, card.object, card.owned_by) == (gateway.model, "model", "callproof")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("org/gpt-unknown")
    assert caught.value.body["code"] == "model_not_found"
    assert "'org/gpt-unknown' is not served here" in caught.value.body["message"]


def test_stream_options_without_stream(gateway: Any) -> None:
    err = error_of(post_chat(gateway, stream_options={"include_usage": True}), 400)
    assert err["param"] == "stream_options"
    padded = {"include_usage": True, "include_obfuscation": True}  # chunks are never padded
    err = error_of(post_chat(gateway, stream=True, stream_options=padded), 400)
    assert (err["param"], err["code"]) == (
        "stream_options.include_obfuscation",
        "unsupported_parameter",
    )
    unknown = {"include_usage": True, "include_nothing": True}
    err = error_of(post_chat(gateway, stream=True, stream_options=unknown), 400)
    assert (err["param"], err["code"]) == (
        "stream_options.include_nothing",
        "unsupported_parameter",
    )


@pytest.mark.parametrize("over", [1, 2**60])  # 2**60: also more than a receipt holds exactly
def test_max_tokens_over_the_limit(gateway: Any, over: int) -> None:
    err = error_of(post_chat(gateway, max_tokens=gateway.settings.max_tokens_limit + over), 400)
    assert (err["param"], err["code"]) == ("max_tokens", "max_tokens_too_large")


def test_a_prompt_over_the_context_window_is_400_naming_messages(gateway: Any) -> None:
    """9,000 words of "hello " are 9,000 tokens, over SmolLM2's 8,192 and the test vLLM
    server's 2,048."""
    err = sdk_error(gateway, messages=[{"role": "user", "content": "hello " * 9_000}])
    assert isinstance(err, openai.BadRequestError)
    assert (err.body["code"], err.body["param"]) == ("context_length_exceeded", "messages")
    assert "maximum context length is" in err.body["message"]


def test_max_tokens_past_the_context_window_is_lowered_to_the_room_left(
    gateway: Any, request: pytest.FixtureRequest
) -> None:
    """Both engines do as vLLM does: a completion that would not fit gets the room the prompt
    leaves (so a long conversation with the default max_tokens still gets an answer)."""
    if gateway.engine.identity.engine == "vllm":
        window = request.getfixturevalue("vllm_server").config.max_model_len
    else:
        window = gateway.engine.model.config.max_position_embeddings
    client = gateway.openai()

    def ask(words: int, max_tokens: int) -> Any:
        return client.chat.completions.create(
            model=gateway.model,
            messages=[{"role": "user", "content": "hello " * words}],
            max_tokens=max_tokens,
            temperature=0,
        )

    framing = ask(100, 1).usage.prompt_tokens - 100  # the chat template's own tokens
    words = window - framing - 3
    completion = ask(words, gateway.settings.max_tokens_limit)
    usage = completion.usage
    assert usage.prompt_tokens == words + framing
    assert usage.completion_tokens <= 3
    assert usage.prompt_tokens + usage.completion_tokens <= window
    if usage.completion_tokens == 3:
        assert completion.choices[0].finish_reason == "length"
    assert completion.model_extra["receipt"]["seq"] >= 1


@pytest.mark.parametrize(
    ("pattern", "feature"),
    [("(?=a)a", "lookahead"), ("(a)\\1", "backreference"), ("\\bfoo", "word boundary")],
)
def test_a_regex_no_backend_can_enforce_is_refused_on_every_engine(
    gateway: Any, pattern: str, feature: str
) -> None:
    """The vLLM path used to send these on to the server; each engine now refuses them alike."""
    err = error_of(post_chat(gateway, regex=pattern), 400)
    assert (err["code"], err["param"]) == ("constraint_unsupported", "regex")
    assert feature in err["message"]


def test_malformed_body_names_the_field(gateway: Any) -> None:
    err = error_of(post_chat(gateway, messages=[]), 400)
    assert err["param"] == "messages"
    err = error_of(post_chat(gateway, temperature="hot"), 400)
    assert err["param"] == "temperature"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "5"),
        ("max_tokens", 5.0),
        ("temperature", "0.5"),
        ("seed", "5"),
        ("stream", "true"),
        ("parallel_tool_calls", "false"),
        ("n", 1.0),
    ],
)
def test_values_are_never_coerced_to_the_fields_type(gateway: Any, field: str, value: Any) -> None:
    """OpenAI refuses "5" for an integer; so does the gateway (the receipt records what was
    asked, not a guess). Litestar's own conversion is lax, so these once passed."""
    err = error_of(post_chat(gateway, **{field: value}), 400)
    assert err["param"] == field and err["code"] == "invalid_value"
    assert "Expected" in err["message"]


def _post_raw(gateway: Any, raw: bytes) -> Any:
    with gateway.http("agent") as client:
        return client.post(
            "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "UTF-8"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": ', "JSON"),
        (b"", "JSON"),
        (
            b'{"model": "m", "tools": [{"function": {"name": "d", "parameters": {"x": '
            + b"[" * 5000
            + b"]" * 5000
            + b"}}}]}",
            "deeper",
        ),
        (  # the model and the receipt's digests saw only "Tokyo"
            b'{"model": "m", "messages": [{"role": "user", "content": "Paris", "content": "Tokyo"}]}',
            "the key 'content' appears twice in one object",
        ),
        (
            b'{"model": "m", "model": "m", "messages": [{"role": "user", "content": "x"}]}',
            "the key 'model' appears twice",
        ),
    ],
    ids=["not-utf8", "truncated", "empty", "nested-5000", "duplicate-content", "duplicate-model"],
)
def test_a_body_that_is_not_json_is_400(gateway: Any, raw: bytes, says: str) -> None:
    err = error_of(_post_raw(gateway, raw), 400)
    assert err["code"] == "invalid_json" and says in err["message"]


@pytest.mark.parametrize(
    ("number", "says"), [("1e400", "out of range"), ("20000000000000001", "2**53")]
)
def test_a_number_a_receipt_cannot_hold_names_the_schema(
    gateway: Any, number: str, says: str
) -> None:
    """JSON has no such limits; Python's json and msgspec would pass the number as it is."""
    parameters = {"type": "object", "properties": {"n": {"maximum": "NUMBER"}}}
    tools = [function_tool("f", parameters)]
    body = json.dumps({"model": gateway.model, "messages": HELLO, "tools": tools})
    err = error_of(_post_raw(gateway, body.replace('"NUMBER"', number).encode()), 400)
    assert err["param"] == "tools[0].function.parameters"
    assert says in err["message"]


def test_a_missing_field_is_named(gateway: Any) -> None:
    err = error_of(_post_raw(gateway, b'{"messages": [{"role": "user", "content": "x"}]}'), 400)
    assert err["param"] == "model" and "missing required field" in err["message"]
    err = error_of(_post_raw(gateway, b'{"model": "m", "messages": [{"content": "x"}]}'), 400)
    assert err["param"] == "messages[0].role"


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -0.5), ("top_p", -0.1), ("top_p", 1.5), ("seed", 2**53), ("seed", -(2**53))],
)
def test_out_of_range_sampling_is_400(gateway: Any, field: str, value: float) -> None:
    assert error_of(post_chat(gateway, **{field: value}), 400)["param"] == field


# OpenAI parameters the gateway does not implement that mean "off" only as null, which an
# SDK wrapper sends for an unset Python argument
NULL_ONLY = (
    "service_tier",
    "reasoning_effort",
    "verbosity",
    "modalities",
    "audio",
    "prediction",
    "web_search_options",
    "functions",
    "function_call",
    "moderation",
)


def test_unimplemented_parameters_pass_only_at_their_neutral_value(gateway: Any) -> None:
    """Clients such as LangChain send frequency_penalty=0, logprobs=false, ... by default:
    those mean "off" and pass; any other value is refused by name, never ignored."""
    completion = gateway.openai().chat.completions.create(
        model=gateway.model,
        messages=HELLO,
        max_tokens=1,
        frequency_penalty=0,
        presence_penalty=0,
        logprobs=False,
        top_logprobs=0,
        logit_bias={},
        store=False,
        metadata={},
        stream_options=None,
        prompt_cache_key="k",  # cache hints, as the SDK names them: accepted, not used
        prompt_cache_retention="in_memory",
        prompt_cache_options={"mode": "implicit", "ttl": "30m"},
        extra_body=dict.fromkeys(NULL_ONLY) | {"safety_identifier": "u1"},
    )
    assert completion.model_extra["receipt"]["seq"] >= 1
    streamed = gateway.openai().chat.completions.create(
        model=gateway.model,
        messages=HELLO,
        max_tokens=1,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    assert [chunk for chunk in streamed][-1].usage.completion_tokens == 1
    for field, value in [
        ("frequency_penalty", 0.5),
        ("presence_penalty", -1),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("logit_bias", {"50256": -100}),
        ("store", True),
        ("metadata", {"k": "v"}),
        *((name, "auto") for name in NULL_ONLY),
        ("functions", [{"name": "f", "parameters": {}}]),
        ("web_search_options", {}),
    ]:
        err = error_of(post_chat(gateway, **{field: value}), 400)
        assert (err["param"], err["code"]) == (field, "unsupported_parameter")
        assert "leave it out" in err["message"]


def test_missing_and_bad_keys_are_401(gateway: Any) -> None:
    assert error_of(post_chat(gateway, role=None), 401)["code"] == "invalid_api_key"
    with gateway.http(None) as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": gateway.model, "messages": HELLO},
            headers={"Authorization": "Bearer cp_not_a_key"},
        )
    assert error_of(response, 401)["code"] == "invalid_api_key"
    with gateway.http(None) as client:
        basic = client.get("/v1/models", headers={"Authorization": "Basic dXNlcjpwYXNz"})
        bare = client.get("/v1/models", headers={"Authorization": gateway.secrets["agent"]})
    assert "a 'Basic' Authorization header" in error_of(basic, 401)["message"]
    assert gateway.secrets["agent"] not in error_of(bare, 401)["message"]  # never echoed
    foreign = "sk-proj-" + "a1b2c3d4" * 5  # another provider's key, sent without "Bearer "
    with gateway.http(None) as client:
        sent = error_of(client.get("/v1/models", headers={"Authorization": foreign}), 401)
    assert foreign not in sent["message"] and sent["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="cp_wrong", max_retries=0).models.list()


def test_two_authorization_headers_are_401_whichever_comes_first(gateway: Any) -> None:
    """The first was used without a word: a proxy reading the last header would have
    checked another caller than the one the gateway acted for."""
    keys = [f"Bearer {gateway.secrets[role]}" for role in ("agent", "auditor")]
    with gateway.http(None) as client:
        for pair in (keys, keys[::-1], keys[:1] * 2):
            headers = [("Authorization", value) for value in pair]
            response = client.get("/v1/models", headers=headers)
            err = error_of(response, 401)
            assert err["code"] == "invalid_api_key" and "2 Authorization headers" in err["message"]
        assert client.get("/v1/models", headers={"Authorization": keys[0]}).status_code == 200


@pytest.mark.parametrize("role", ["auditor", "admin"])
def test_non_agent_keys_cannot_call_v1(gateway: Any, role: str) -> None:
    err = error_of(post_chat(gateway, role=role), 403)
    assert err["code"] == "wrong_role"
    assert f"an {role} key cannot use /v1/chat/completions: it needs an agent key" == err["message"]


def test_admin_keys_cannot_read_the_audit_routes(gateway: Any) -> None:
    """An admin manages keys; reading a chain takes an auditor key of its tenant."""
    with gateway.http("admin") as client:
        for path in ("/audit/receipts", "/audit/checkpoints/latest"):
            refused = error_of(client.get(path), 403)
            assert (refused["code"], refused["type"]) == ("wrong_role", "permission_error")


def test_a_request_the_receipt_cannot_digest_exactly_is_400(gateway: Any) -> None:
    """An unknown member of response_format (kept in the digested body; the text format
    ignores it) holding an integer past 2**53 has no RFC 8785 form: a 400 naming why, not a
    500."""
    response_format = {"type": "text", "extra": 2**54 + 1}
    response = post_chat(gateway, response_format=response_format)
    assert "cannot be recorded exactly" in error_of(response, 400)["message"]


def test_agent_keys_cannot_call_audit_or_admin(gateway: Any) -> None:
    with gateway.http("agent") as client:
        refused = error_of(client.get("/audit/receipts"), 403)
        assert (refused["code"], refused["type"]) == ("wrong_role", "permission_error")
        assert error_of(client.get("/admin/keys"), 403)["code"] == "wrong_role"


def test_unknown_route_and_wrong_method_in_the_error_shape(gateway: Any) -> None:
    with gateway.http("agent") as client:
        assert error_of(client.get("/v1/nothing-here"), 404)["code"] == "not_found"
        wrong_method = client.get("/v1/chat/completions")
        assert error_of(wrong_method, 405)["code"] == "method_not_allowed"
        allowed = set(wrong_method.headers["allow"].split(", "))  # RFC 9110: a 405 says
        assert allowed == {"POST", "OPTIONS"}, allowed  # what is allowed, and it is
        assert client.options("/v1/chat/completions").status_code == 204
    tool_choice_alone = error_of(post_chat(gateway, tool_choice="required"), 400)
    assert tool_choice_alone["code"] == "invalid_value"  # a code docs/api.md lists


@pytest.mark.model
def test_truncated_constrained_output_is_422_and_not_receipted(gateway: Any) -> None:
    """Three tokens cannot finish a tool call: the output is refused with where it broke,
    never returned as a call and never receipted. Under tools the raw output is withheld:
    it holds the calls before the one cut off, whole and with no receipt (an agent could
    run them with no trace in the ledger)."""
    before = gateway.ledger.query(ReceiptQuery(tenant=gateway.tenant, limit=1000)).items
    err = sdk_error(gateway, tools=[TOOL], tool_choice="required", max_tokens=3, temperature=0)
    assert isinstance(err, openai.UnprocessableEntityError)
    error = err.body
    assert error["code"] == "structured_output_invalid"
    assert error["raw_output"] is None and "pointer" in error and error["schema"]["$defs"]
    assert error["param"] == "max_tokens"
    assert error["message"].startswith("max_tokens=3 ran out before the constrained output")
    assert error["message"].endswith(
        "raw_output withheld: tool calls leave only with their receipt"
    )
    with pytest.raises(openai.APIError) as streamed:  # the stream's error event says the same
        for _ in gateway.openai().chat.completions.create(
            model=gateway.model,
            messages=HELLO,
            tools=[TOOL],
            tool_choice="required",
            max_completion_tokens=3,
            temperature=0,
            stream=True,
        ):
            pass
    assert streamed.value.body["param"] == "max_completion_tokens"
    assert streamed.value.body["raw_output"] is None
    after = gateway.ledger.query(ReceiptQuery(tenant=gateway.tenant, limit=1000)).items
    assert [r.id for r in after] == [r.id for r in before]


@pytest.mark.model
def test_a_failed_fallback_under_tools_withholds_its_raw_output(gateway: Any) -> None:
    """No grammar backend enforces a oneOf whose branches overlap, so the embedded engine
    decodes freely and validates after (retrying twice). Five tokens cannot make a call:
    the 422 goes out without the raw output, plain and streamed, as a constrained one does."""
    if gateway.engine.identity.engine != "embedded":
        pytest.skip("the post-hoc fallback is the embedded engine's")
    amount = {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}
    tool = function_tool(
        "pay", {"type": "object", "properties": {"amount": amount}, "required": ["amount"]}
    )
    params = {"tools": [tool], "tool_choice": "required", "max_tokens": 5, "temperature": 0}
    err = sdk_error(gateway, **params)
    assert isinstance(err, openai.UnprocessableEntityError)
    assert err.body["raw_output"] is None and err.body["param"] == "tools", err.body
    assert err.body["message"].endswith(
        "raw_output withheld: tool calls leave only with their receipt"
    )
    streamed = sdk_error(gateway, **params, stream=True)
    assert streamed.status_code == 422 and streamed.body["raw_output"] is None, streamed.body


@pytest.mark.model
def test_a_stop_string_inside_the_constrained_output_is_named(gateway: Any) -> None:
    """A stop string the JSON itself contains cuts the call short: the 422 names `stop`."""
    err = sdk_error(
        gateway, tools=[TOOL], tool_choice="required", stop=['"'], max_tokens=40, temperature=0
    )
    assert isinstance(err, openai.UnprocessableEntityError)
    assert err.body["param"] == "stop"
    assert err.body["message"].startswith("the stop string '\"' ended the output before")


def test_a_damaged_chain_is_named_not_a_bare_internal_error() -> None:
    from gateway.errors import error_for
    from receipts.errors import ChainDamaged

    status, body = error_for(ChainDamaged("receipt seq 3 of chain 'acme' is missing"))
    assert status == 500 and body["error"]["code"] == "chain_damaged"
    assert "seq 3" in body["error"]["message"] and "/audit/verify" in body["error"]["message"]


def test_an_engine_fault_is_named_not_a_bare_internal_error() -> None:
    from gateway.errors import error_for
    from runtime.constrained import GrammarViolation

    status, body = error_for(GrammarViolation("token 7 rejected by the grammar it was masked to"))
    assert status == 500 and body["error"]["code"] == "engine_fault"
    assert "token 7 rejected" in body["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions", {"model": "x", "messages": [], "n": 2}),
        ("POST", "/admin/keys", {"role": "nobody"}),
        ("POST", "/audit/verify", {"from_seq": "one"}),
        ("POST", "/audit/replay/rcpt_00112233445566778899aabb", {"force": "yes"}),
    ],
)
def test_an_anonymous_body_is_not_read_before_the_401(
    gateway: Any, method: str, path: str, body: dict[str, Any]
) -> None:
    """Authentication comes first (a guard, ahead of Litestar's body parsing): an anonymous
    caller learns nothing about what the body should hold."""
    with gateway.http(None) as client:
        response = client.request(method, path, json=body)
    assert error_of(response, 401)["code"] == "invalid_api_key"
    with gateway.http("agent" if path.startswith("/v1") else "auditor") as client:
        wrong_role = client.request(method, path, json=body) if path.startswith("/admin") else None
    if wrong_role is not None:
        assert error_of(wrong_role, 403)["code"] == "wrong_role"


def read_answer(conn: socket.socket, trickle: bool = False) -> bytes:
    """A whole HTTP/1.1 answer with a JSON body, as the raw bytes; ``trickle``: send a byte of
    body every 0.3 s while waiting for it."""
    conn.settimeout(0.3 if trickle else 15)
    answer, deadline = b"", time.monotonic() + 20
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        assert time.monotonic() < deadline, answer
        try:
            if trickle:
                conn.sendall(b" ")
            chunk = conn.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # the server closed the connection after answering
            break
        if not chunk:
            break
        answer += chunk
    return answer


def post_head(secret: str, length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
        + f"Authorization: Bearer {secret}\r\n".encode()
        + f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
    )


@pytest.mark.parametrize("client", ["stops short", "trickles"])
def test_a_body_not_all_sent_within_body_timeout_s_is_408(
    gateway_engine: Any, server_loop: Any, tmp_path: Path, fresh_sqlite_url: str, client: str
) -> None:
    """A client that sends less than its Content-Length and waits (slowloris) held the
    connection and its handler with no end: now the body is due within body_timeout_s of the
    request's start, however it trickles in (a byte every 0.3 s leaves no gap that long)."""
    with fresh_gateway(
        gateway_engine, server_loop, tmp_path, fresh_sqlite_url, body_timeout_s=1.0
    ) as (base, secret, ledger):
        host, port = base.removeprefix("http://").split(":")
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=15) as conn:
            conn.sendall(post_head(secret, 500) + b'{"model":')
            answer = read_answer(conn, trickle=client == "trickles")
        assert time.monotonic() - started < 8  # 1 s, on a busy VM
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout" and "body_timeout_s (1 s)" in error["message"]
        assert ledger.reach("acme") == 0


@pytest.mark.model
def test_a_stream_that_outlasts_the_body_deadline_is_not_cut_off(
    gateway_engine: Any, server_loop: Any, tmp_path: Path, fresh_sqlite_url: str
) -> None:
    """Once the body is in, the deadline is done: a stream longer than body_timeout_s runs to
    its end and its receipt."""
    with fresh_gateway(
        gateway_engine, server_loop, tmp_path, fresh_sqlite_url, body_timeout_s=0.5
    ) as (base, secret, ledger):  # 0.5 s: httpx sends head and body in two writes
        body = {
            "model": gateway_engine.identity.model,
            "stream": True,
            "max_tokens": 64,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Write letters."}],
            "regex": "[a-z ]{64}",  # cannot end early: some seconds of decoding
        }
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {secret}"}
        with (
            httpx.Client(base_url=base, headers=headers, timeout=120) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert time.monotonic() - started > 0.6, "the stream ended before the deadline"
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert ledger.reach("acme") == 1
