"""runtime.tools, closed_schema, union_schema, schema_check and output_parsing: the tools
field, closed objects, the union schema per tool_choice, call ids, and parsing output back
into calls with defence-in-depth validation."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from tool_samples import ANSWER_SCHEMA, BOOKING_PARAMS, TOOLS, WEATHER_PARAMS, function_tool

from runtime.call_ids import CALL_ID_RE, CallIds, new_call_id
from runtime.closed_schema import closed_schema
from runtime.constraint import Constraint, validate_constraint
from runtime.errors import (
    ConstraintTooComplex,
    InvalidSchema,
    InvalidTools,
    StructuredOutputInvalid,
    UnknownTool,
)
from runtime.limits import check_constraint
from runtime.output_parsing import ToolCall, parse_envelope, parse_native_tool_call
from runtime.planning import ChatInput, plan_chat
from runtime.schema_check import check_schema, validate
from runtime.tools import parse_response_format, parse_tools_field
from runtime.union_schema import union_calls, union_schema

SPECS = parse_tools_field(TOOLS)
WEATHER_CALL = {"tool": "get_weather", "arguments": {"city": "Paris"}}
BOOK_CALL = {"tool": "book_room", "arguments": {"guest": {"name": "Ada"}, "nights": 2}}
ANSWER = {"answer": "It is sunny."}


def accepts(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


# --------------------------------------------------------------------------- tools field


def test_parse_tools_field_keeps_each_tool() -> None:
    assert [s.name for s in SPECS] == ["get_weather", "book_room", "list_rooms"]
    assert SPECS[0].parameters == WEATHER_PARAMS
    assert SPECS[0].description == "Current weather for a city"
    assert SPECS[2].parameters == {"type": "object", "properties": {}}
    assert not SPECS[0].strict


def test_tools_are_copied_not_aliased() -> None:
    tools = [function_tool("f", {"type": "object", "properties": {}})]
    spec = parse_tools_field(tools)[0]
    tools[0]["function"]["parameters"]["properties"]["x"] = {}
    assert spec.parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"type": "function"}, "tools"),
        ([], "tools"),
        (["get_weather"], "tools[0]"),
        ([{"type": "retrieval", "function": {"name": "x"}}], "tools[0].type"),
        ([{"type": "function"}], "tools[0].function"),
        ([function_tool("")], "tools[0].function.name"),
        ([function_tool("get weather")], "tools[0].function.name"),
        ([function_tool("a.b")], "tools[0].function.name"),
        ([function_tool("x" * 65)], "tools[0].function.name"),
        ([function_tool("get_weather\n")], "tools[0].function.name"),
        ([TOOLS[0], function_tool("ok"), TOOLS[0]], "tools[2].function.name"),
        ([function_tool("f", {"type": "array", "items": {}})], "tools[0].function.parameters"),
        ([function_tool("f", ["city"])], "tools[0].function.parameters"),
        ([function_tool("f", {"properties": {}})], "tools[0].function.parameters"),
    ],
)
def test_bad_tools_field_names_the_element(tools: Any, param: str) -> None:
    with pytest.raises(InvalidTools) as err:
        parse_tools_field(tools)
    assert err.value.param == param
    assert err.value.code == "invalid_tools"


def test_duplicate_name_is_reported_as_duplicate() -> None:
    with pytest.raises(InvalidTools, match="duplicate tool name 'get_weather'"):
        parse_tools_field([TOOLS[0], TOOLS[0]])


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"a": {"type": "strng"}}},
        {"type": "object", "required": "a"},
        {"type": "object", "properties": {"a": {"minLength": -1}}},
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
    ],
)
def test_invalid_parameter_schema_is_invalid_schema(parameters: dict[str, Any]) -> None:
    with pytest.raises(InvalidSchema) as err:
        parse_tools_field([function_tool("ok"), function_tool("f", parameters)])
    assert err.value.param == "tools[1].function.parameters"


@pytest.mark.parametrize(
    "value",
    ["\ud800", object(), float("nan"), float("inf")],
    ids=["lone-surrogate", "object", "nan", "infinity"],
)
def test_a_schema_holding_a_non_json_value_is_invalid_schema(value: object) -> None:
    """Python callers of the runtime can pass what no JSON body can carry."""
    parameters = {"type": "object", "properties": {"a": {"type": "string", "const": value}}}
    with pytest.raises(InvalidSchema, match="is not JSON") as err:
        parse_tools_field([function_tool("f", parameters)])
    assert err.value.param == "tools[0].function.parameters"


def test_a_python_only_regex_is_refused_up_front() -> None:
    """JSON Schema patterns are ECMA-262: Python's \\Z passes the metaschema (which uses
    Python's re) but the validator outputs are checked with cannot compile it, so the request
    is refused with the reason instead of failing after generation."""
    pattern = {"type": "object", "properties": {"a": {"type": "string", "pattern": "a\\Z"}}}
    with pytest.raises(InvalidSchema, match="cannot be compiled") as err:
        parse_tools_field([function_tool("f", pattern)])
    assert err.value.param == "tools[0].function.parameters"


def test_a_value_nested_too_deep_to_report_still_fails_as_invalid_output() -> None:
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    raw = json.dumps({"tool": "get_weather", "arguments": {"city": deep}})
    with pytest.raises(StructuredOutputInvalid) as err:
        parse_envelope(raw, SPECS)
    assert err.value.status == 422


def test_strict_is_recorded_and_the_schema_kept_verbatim() -> None:
    tool = function_tool("book", BOOKING_PARAMS)
    tool["function"]["strict"] = True
    spec = parse_tools_field([tool])[0]
    assert spec.strict and spec.parameters == BOOKING_PARAMS


def test_closed_schema_closes_objects_that_list_properties() -> None:
    closed = closed_schema(BOOKING_PARAMS)
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["Guest"]["additionalProperties"] is False
    assert "additionalProperties" not in BOOKING_PARAMS  # the caller's dict is untouched
    kept = {
        "type": "object",
        "properties": {
            "free": {"type": "object"},
            "tags": {
                "type": "object",
                "properties": {},
                "additionalProperties": {"type": "string"},
            },
            "both": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
        },
    }
    closed = closed_schema(kept)
    assert closed["properties"] == kept["properties"]
    assert accepts(closed, {"free": {"x": 1}, "tags": {"k": "v"}, "both": {"a": 1, "b": 2}})


def test_closing_keeps_a_required_key_that_properties_does_not_list() -> None:
    """Closed to its properties alone, this object could never hold "country": every call
    failed with a 422 blaming the model."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city", "country"],
    }
    closed = closed_schema(schema)
    assert closed["properties"] == {"city": {"type": "string"}, "country": {}}
    assert accepts(closed, {"city": "Lima", "country": ["any", "value"]})
    assert not accepts(closed, {"city": "Lima", "country": "Peru", "extra": 1})
    assert schema["properties"] == {"city": {"type": "string"}}  # the caller's is untouched


# --------------------------------------------------------------------------- union schema


def test_auto_admits_every_tool_and_the_answer() -> None:
    schema = union_schema(SPECS, "auto")
    for ok in (WEATHER_CALL, BOOK_CALL, {"tool": "list_rooms", "arguments": {}}, ANSWER):
        assert accepts(schema, ok), ok
    for bad in (
        {"tool": "delete_db", "arguments": {}},
        {"tool": "get_weather", "arguments": {"city": 3}},
        {"tool": "get_weather", "arguments": {}},
        {**WEATHER_CALL, "answer": "both"},
        {**WEATHER_CALL, "extra": 1},
        {"answer": 42},
        {"tool_calls": [WEATHER_CALL]},  # parallel is off
        [WEATHER_CALL],
    ):
        assert not accepts(schema, bad), bad


def test_none_admits_only_the_answer() -> None:
    schema = union_schema(SPECS, "none")
    assert accepts(schema, ANSWER)
    assert not accepts(schema, WEATHER_CALL)
    assert "anyOf" not in schema  # a single branch is the schema itself


def test_required_rejects_the_answer() -> None:
    schema = union_schema(SPECS, "required")
    assert accepts(schema, WEATHER_CALL) and accepts(schema, BOOK_CALL)
    assert not accepts(schema, ANSWER)


def test_named_admits_exactly_that_tool() -> None:
    schema = union_schema(SPECS, {"type": "function", "function": {"name": "book_room"}})
    assert accepts(schema, BOOK_CALL)
    assert not accepts(schema, WEATHER_CALL)
    assert not accepts(schema, ANSWER)


def test_named_unknown_tool_lists_the_available_ones() -> None:
    with pytest.raises(UnknownTool) as err:
        union_schema(SPECS, {"type": "function", "function": {"name": "get_wether"}})
    assert err.value.param == "tool_choice"
    assert "get_wether" in err.value.message
    assert "get_weather, book_room, list_rooms" in err.value.message


@pytest.mark.parametrize("choice", ["sometimes", {"type": "function"}, {"type": "tool"}, 3])
def test_malformed_tool_choice(choice: Any) -> None:
    with pytest.raises(InvalidTools):
        union_schema(SPECS, choice)


def _allowed(mode: str, *names: str) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def test_allowed_tools_admit_only_those_tools() -> None:
    """OpenAI's allowed_tools: every tool stays in the request (and the prompt), the decoder
    may call only the listed ones; "auto" may still answer, "required" may not."""
    auto = union_schema(SPECS, _allowed("auto", "book_room"), parallel_tool_calls=True)
    assert accepts(auto, BOOK_CALL) and accepts(auto, ANSWER)
    assert accepts(auto, {"tool_calls": [BOOK_CALL, BOOK_CALL]})
    assert not accepts(auto, WEATHER_CALL)
    assert not accepts(auto, {"tool_calls": [BOOK_CALL, WEATHER_CALL]})
    required = union_schema(SPECS, _allowed("required", "book_room", "get_weather"))
    assert accepts(required, BOOK_CALL) and accepts(required, WEATHER_CALL)
    assert not accepts(required, ANSWER)
    assert not accepts(required, {"tool": "list_rooms", "arguments": {}})


def test_allowed_tools_are_named_in_the_prompt() -> None:
    user = [{"role": "user", "content": "Book me a room."}]
    plan = plan_chat(ChatInput(user, tools=TOOLS, tool_choice=_allowed("required", "book_room")))
    assert "You must call at least one of these functions: book_room." in plan.messages[0].content
    assert "get_weather" in plan.messages[0].content  # still listed, as OpenAI keeps them


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        (_allowed("none", "book_room"), "tool_choice.allowed_tools.mode"),
        (_allowed("auto"), "tool_choice.allowed_tools.tools"),
        (
            {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{}]}},
            "tool_choice.allowed_tools.tools[0].function.name",
        ),
        ({"type": "allowed_tools"}, "tool_choice.allowed_tools.mode"),
    ],
)
def test_malformed_allowed_tools_name_the_part(choice: Any, param: str) -> None:
    with pytest.raises(InvalidTools) as err:
        union_schema(SPECS, choice)
    assert err.value.param == param


def test_allowed_tools_naming_an_unknown_tool() -> None:
    with pytest.raises(UnknownTool) as err:
        union_schema(SPECS, _allowed("auto", "book_room", "get_wether"))
    assert err.value.param == "tool_choice"
    assert "'get_wether'" in err.value.message and "get_weather, book_room" in err.value.message


def test_parallel_admits_a_list_of_calls_and_a_single_call() -> None:
    schema = union_schema(SPECS, "auto", parallel_tool_calls=True)
    assert accepts(schema, {"tool_calls": [WEATHER_CALL, BOOK_CALL, WEATHER_CALL]})
    assert accepts(schema, WEATHER_CALL)
    assert accepts(schema, ANSWER)
    assert not accepts(schema, {"tool_calls": []})
    assert not accepts(schema, {"tool_calls": [ANSWER]})
    assert not accepts(schema, {"tool_calls": [{"tool": "get_weather", "arguments": {}}]})


def test_parallel_with_a_named_choice_admits_only_that_tool_in_the_list() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    schema = union_schema(SPECS, named, parallel_tool_calls=True)
    assert accepts(schema, {"tool_calls": [WEATHER_CALL, WEATHER_CALL]})
    assert not accepts(schema, {"tool_calls": [WEATHER_CALL, BOOK_CALL]})
    assert not accepts(schema, ANSWER)


def test_response_format_becomes_the_answer_branch() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": ANSWER_SCHEMA}}
    schema = union_schema(SPECS, "auto", rf)
    assert accepts(schema, {"answer": {"summary": "ok", "score": 1.5}})
    assert not accepts(schema, ANSWER)  # a plain string no longer answers
    assert not accepts(schema, {"answer": {"summary": "ok"}})
    assert accepts(schema, WEATHER_CALL)


def test_union_arguments_admit_no_invented_keys() -> None:
    """A small model copies schema words into arguments unless the grammar forbids it."""
    schema = union_schema(SPECS, "auto")
    assert not accepts(schema, {"tool": "get_weather", "arguments": {"city": "x", "type": "s"}})
    nested = {"tool": "book_room", "arguments": {"guest": {"name": "A", "nights": 1}, "nights": 1}}
    assert not accepts(schema, nested)
    assert not accepts(schema, {"tool": "list_rooms", "arguments": {"anything": 1}})


def test_refs_keep_resolving_once_embedded() -> None:
    schema = union_schema(SPECS, "auto", parallel_tool_calls=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert accepts(schema, {"tool_calls": [BOOK_CALL]})
    bad_guest = {"tool": "book_room", "arguments": {"guest": {"age": 3}, "nights": 1}}
    assert not accepts(schema, bad_guest)
    assert not accepts(schema, {"tool_calls": [bad_guest]})


PET_WITH_ID = {
    "$id": "https://example.com/schemas/register_pet",
    "type": "object",
    "properties": {"pet": {"$ref": "#/$defs/Pet"}},
    "required": ["pet"],
    "$defs": {
        "Pet": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    },
}


@pytest.mark.parametrize("parallel", [False, True])
def test_refs_resolve_once_embedded_despite_a_root_id(parallel: bool) -> None:
    """A root ``$id`` (schema generators emit one) kept in the union rebased the rewritten
    pointer onto the tool's own subschema: the output check could not build its validator
    and every decoded call was a 500. The same schema as the answer branch, too."""
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PET_WITH_ID}}
    tools = parse_tools_field([function_tool("register_pet", PET_WITH_ID)])
    union = union_schema(tools, "auto", rf, parallel)
    call = {"tool": "register_pet", "arguments": {"pet": {"name": "Rex"}}}
    for value in (call, {"answer": {"pet": {"name": "Rex"}}}):
        validate(value, union, json.dumps(value), param="tools")
    with pytest.raises(StructuredOutputInvalid, match="output fails its schema"):
        bad = {"tool": "register_pet", "arguments": {"pet": {}}}
        validate(bad, union, json.dumps(bad), param="tools")


@pytest.mark.parametrize(
    ("params", "good", "bad"),
    [
        (
            {
                "type": "object",
                "properties": {"a": {"$anchor": "word", "type": "string"}, "b": {"$ref": "#word"}},
                "required": ["b"],
            },
            {"b": "hello"},
            {"b": 1},
        ),
        (
            {
                "type": "object",
                "properties": {
                    "a": {
                        "$id": "https://example.com/a",
                        "type": "object",
                        "properties": {"q": {"$ref": "#/$defs/s"}},
                        "$defs": {"s": {"type": "string"}},
                    }
                },
            },
            {"a": {"q": "x"}},
            {"a": {"q": 1}},
        ),
    ],
    ids=["anchor", "nested-id"],
)
def test_anchor_and_nested_id_refs_resolve_once_embedded(
    params: dict[str, Any], good: dict[str, Any], bad: dict[str, Any]
) -> None:
    """``#word`` was rewritten to ``#/$defs/tool-fword``, and a ref inside a nested ``$id``
    was re-based onto the union's root: dangling, lm-format-enforcer crashed mid-decode.
    Both are pointers from the union's root now."""
    union = union_schema(parse_tools_field([function_tool("f", params)]), "required")
    validate({"tool": "f", "arguments": good}, union, "", param="tools")
    with pytest.raises(StructuredOutputInvalid):
        validate({"tool": "f", "arguments": bad}, union, "", param="tools")


@pytest.mark.parametrize(
    ("node", "words"),
    [
        ({"$dynamicRef": "#meta"}, "$dynamicRef at /properties/b: dynamic references"),
        ({"$dynamicAnchor": "meta"}, "$dynamicAnchor at /properties/b"),
        ({"$anchor": "a", "type": "string"}, "$anchor 'a' at /properties/"),
    ],
    ids=["dynamic-ref", "dynamic-anchor", "anchor-twice"],
)
def test_identifiers_the_union_cannot_carry_are_refused(node: dict[str, Any], words: str) -> None:
    params = {"type": "object", "properties": {"a": {"$anchor": "a"}, "b": node}}
    with pytest.raises(InvalidSchema) as err:
        parse_tools_field([function_tool("f", params)])
    assert err.value.param == "tools[0].function.parameters" and words in err.value.message


def test_embedding_leaves_refs_inside_data_alone() -> None:
    """A ``const`` is a value, not a schema: rewritten, the union demanded another value than
    the tool's own schema, and every call failed the parse with a 422."""
    marker = {"$ref": "#/$defs/Guest"}
    params = {
        **BOOKING_PARAMS,
        "properties": {**BOOKING_PARAMS["properties"], "m": {"const": marker}},
    }
    union = union_schema(parse_tools_field([function_tool("book", params)]), "required")
    call = {"tool": "book", "arguments": {"guest": {"name": "Ada"}, "nights": 1, "m": marker}}
    validate(call, union, json.dumps(call), param="tools")


@pytest.mark.parametrize("parallel", [False, True])
def test_union_calls_lists_the_allowed_tools(parallel: bool) -> None:
    auto = union_schema(SPECS, "auto", parallel_tool_calls=parallel)
    calls = dict(union_calls(auto))
    assert list(calls) == ["get_weather", "book_room", "list_rooms"]
    resolvable = {**calls["book_room"], "$defs": auto["$defs"]}
    assert accepts(resolvable, BOOK_CALL["arguments"])
    assert not accepts(resolvable, {"guest": {"name": "Ada"}, "nights": 0})
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert [n for n, _ in union_calls(union_schema(SPECS, named, None, parallel))] == [
        "get_weather"
    ]
    assert union_calls(union_schema(SPECS, "none")) == ()


def union_variants() -> list[dict[str, Any]]:
    rf = parse_response_format(
        {"type": "json_schema", "json_schema": {"name": "r", "schema": ANSWER_SCHEMA}}
    )
    named = {"type": "function", "function": {"name": "book_room"}}
    return [
        union_schema(SPECS, choice, fmt, parallel)
        for choice in ("auto", "none", "required", named)
        for fmt in (None, rf)
        for parallel in (False, True)
    ]


def test_union_compiles_with_llguidance() -> None:
    import llguidance  # the dev install has every backend: missing is a failure, not a skip

    for schema in union_variants():
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        assert llguidance.LLMatcher.validate_grammar(grammar) == ""


def test_union_compiles_with_xgrammar() -> None:
    import xgrammar

    for schema in union_variants():
        xgrammar.Grammar.from_json_schema(json.dumps(schema))


# --------------------------------------------------------------------------- call ids


def test_call_ids_are_call_and_24_hex_and_unique() -> None:
    ids = {new_call_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(CALL_ID_RE.fullmatch(i) for i in ids)


def test_call_ids_are_stable_per_index() -> None:
    ids = CallIds()
    first = [ids.for_index(1), ids.for_index(0)]
    assert first == [ids.for_index(1), ids.for_index(0)]
    assert first[0] != first[1]


def test_a_retry_keeps_the_call_id() -> None:
    ids = CallIds()
    first = parse_envelope(json.dumps(WEATHER_CALL), SPECS, ids=ids)
    retried = parse_envelope(json.dumps(WEATHER_CALL), SPECS, ids=ids)
    assert first.tool_calls[0].id == retried.tool_calls[0].id
    fresh = parse_envelope(json.dumps(WEATHER_CALL), SPECS)
    assert fresh.tool_calls[0].id != first.tool_calls[0].id


def test_arguments_json_is_compact_utf8() -> None:
    call = ToolCall("call_" + "0" * 24, "get_weather", {"city": "Zürich", "n": [1, 2]})
    assert call.arguments_json() == '{"city":"Zürich","n":[1,2]}'
    assert call.to_openai()["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Zürich","n":[1,2]}',
    }


# --------------------------------------------------------------------------- envelope parsing


def test_envelope_single_call() -> None:
    result = parse_envelope(json.dumps(WEATHER_CALL), SPECS)
    assert result.kind == "tool_calls"
    (call,) = result.tool_calls
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})
    assert CALL_ID_RE.fullmatch(call.id)
    assert result.content is None and result.parsed is None


def test_envelope_parallel_calls_in_order_with_distinct_ids() -> None:
    text = json.dumps({"tool_calls": [WEATHER_CALL, BOOK_CALL]})
    result = parse_envelope(text, SPECS, schema=union_schema(SPECS, parallel_tool_calls=True))
    assert [c.name for c in result.tool_calls] == ["get_weather", "book_room"]
    assert len({c.id for c in result.tool_calls}) == 2


def test_envelope_answer_and_structured_answer() -> None:
    answer = parse_envelope(' {"answer": "Hi"} ', SPECS, schema=union_schema(SPECS))
    assert (answer.kind, answer.answer, answer.content) == ("answer", "Hi", "Hi")
    value = {"summary": "ok", "score": 2}
    parsed = parse_envelope(json.dumps({"answer": value}), SPECS, response_schema=ANSWER_SCHEMA)
    assert (parsed.kind, parsed.parsed) == ("parsed", value)
    assert json.loads(parsed.content) == value
    assert parsed.tool_calls == ()


@pytest.mark.parametrize(
    ("output", "pointer"),
    [
        ({"tool": "get_weather", "arguments": {"city": ""}}, "/arguments/city"),
        ({"tool": "get_weather", "arguments": {"unit": "kelvin", "city": "x"}}, "/arguments/unit"),
        ({"tool": "book_room", "arguments": {"guest": {}, "nights": 1}}, "/arguments/guest"),
        ({"tool": "drop_tables", "arguments": {}}, "/tool"),
        (
            {"tool_calls": [WEATHER_CALL, {"tool": "get_weather", "arguments": {"city": 1}}]},
            "/tool_calls/1/arguments/city",
        ),
    ],
)
def test_arguments_are_validated_again(output: dict[str, Any], pointer: str) -> None:
    """Defence in depth: whatever the decoder let through, a bad call never parses."""
    raw = json.dumps(output)
    with pytest.raises(StructuredOutputInvalid) as err:
        parse_envelope(raw, SPECS)
    assert err.value.pointer == pointer
    assert err.value.raw_output == raw
    assert err.value.status == 422


def test_failing_arguments_name_the_tool_schema() -> None:
    with pytest.raises(StructuredOutputInvalid) as err:
        parse_envelope('{"tool": "get_weather", "arguments": {}}', SPECS)
    assert err.value.schema == WEATHER_PARAMS
    assert "city" in err.value.message


def test_a_failing_object_or_array_is_named_not_quoted() -> None:
    """jsonschema-rs quotes the failing value whole: for a tool_calls array, whole tool calls
    that no receipt records, in a 422 whose raw output is withheld for that very reason.
    Such a value is named by the keyword it breaks; a scalar, or a missing property, is
    still quoted."""
    schema = {"type": "object", "properties": {"tool_calls": {"type": "array", "maxItems": 1}}}
    with pytest.raises(StructuredOutputInvalid) as err:
        validate({"tool_calls": [WEATHER_CALL, WEATHER_CALL]}, schema, "raw", param="tools")
    assert err.value.message == (
        "output fails its schema at '/tool_calls': the array breaks the schema's 'maxItems'"
        " (at '/properties/tool_calls/maxItems' in the schema)"
    )
    with pytest.raises(StructuredOutputInvalid) as err:
        validate({"city": 1}, WEATHER_PARAMS, "raw", param="tools")
    assert err.value.message == "output fails its schema at '/city': 1 is not of type \"string\""
    with pytest.raises(StructuredOutputInvalid) as err:
        validate({}, WEATHER_PARAMS, "raw", param="tools")
    assert err.value.message.endswith('"city" is a required property')


def test_union_violations_are_caught_by_the_bound_schema() -> None:
    with pytest.raises(StructuredOutputInvalid):
        parse_envelope(json.dumps(ANSWER), SPECS, schema=union_schema(SPECS, "required"))
    named = union_schema(SPECS, {"type": "function", "function": {"name": "book_room"}})
    with pytest.raises(StructuredOutputInvalid):
        parse_envelope(json.dumps(WEATHER_CALL), SPECS, schema=named)


COUNTER = parse_tools_field([function_tool("count", {"type": "object", "properties": {"n": {}}})])


@pytest.mark.parametrize("number", ["9007199254740992", "-1e400", "NaN", "-Infinity"])
def test_numbers_a_receipt_cannot_hold_exactly_fail_the_parse(number: str) -> None:
    """The schema allows any number; the receipt's canonical JSON (RFC 8785) does not."""
    raw = f'{{"tool": "count", "arguments": {{"n": {number}}}}}'
    with pytest.raises(StructuredOutputInvalid) as err:
        parse_envelope(raw, COUNTER)
    assert "cannot record exactly" in err.value.message
    assert number.lstrip("-") in err.value.message
    assert err.value.status == 422


@pytest.mark.parametrize(
    "raw",
    [
        '{"tool": "count", "arguments": {"n": [7, 7], "n": [1, 2]}}',
        '{"tool": "count", "arguments": {"n": {"to": "alice", "to": "alice"}}}',  # same value
        '{"tool": "count", "tool": "count", "arguments": {"n": 1}}',  # the envelope's own key
        '{"tool_calls": [{"tool": "count", "arguments": {"n": [{"k": 1, "k": 2}]}}]}',
    ],
)
def test_an_output_naming_a_key_twice_fails_the_parse(raw: str) -> None:
    """The grammars (llguidance, xgrammar) let a model write a key twice where the schema
    leaves keys free. The agent gets the model's text and may act on the first value, while
    the receipt recorded (and validated) the last."""
    with pytest.raises(StructuredOutputInvalid) as err:
        parse_envelope(raw, COUNTER)
    assert "names the key" in err.value.message and err.value.status == 422
    assert err.value.raw_output == raw


@pytest.mark.parametrize("text", ["\\ud800", "\\udfff tail", "\ud800"])
def test_an_output_string_with_a_lone_surrogate_fails_the_parse(text: str) -> None:
    """No UTF-8 form, so no receipt: the seal failed in the ledger's writer, a 500."""
    raw = '{"tool": "count", "arguments": {"n": "' + text + '"}}'
    with pytest.raises(StructuredOutputInvalid) as err:
        parse_envelope(raw, COUNTER)
    assert "holds a lone surrogate" in err.value.message and err.value.status == 422
    pair = parse_envelope('{"tool": "count", "arguments": {"n": "\\ud83d\\ude00"}}', COUNTER)
    assert pair.tool_calls[0].arguments == {"n": "\U0001f600"}


def test_a_schema_holding_an_inexact_integer_is_refused() -> None:
    """The manifest binds the schema as RFC 8785 JSON, exact only within +-(2**53 - 1)."""
    with pytest.raises(InvalidSchema) as err:
        check_schema({"type": "integer", "maximum": 2**53}, "tools[0].function.parameters")
    assert "9007199254740992" in err.value.message
    assert err.value.param == "tools[0].function.parameters"
    check_schema({"type": "integer", "maximum": 2**53 - 1}, "tools[0].function.parameters")


@pytest.mark.parametrize("number", ["9007199254740991", "-9007199254740991", "1.5e300", "-0.0"])
def test_numbers_at_the_exact_range_edges_parse(number: str) -> None:
    raw = f'{{"tool": "count", "arguments": {{"n": {number}}}}}'
    (call,) = parse_envelope(raw, COUNTER).tool_calls
    assert call.arguments["n"] == float(number)


@pytest.mark.parametrize("raw", ['{"tool": "get_weather", "argum', "", "[]", '{"other": 1}'])
def test_malformed_envelopes(raw: str) -> None:
    with pytest.raises(StructuredOutputInvalid):
        parse_envelope(raw, SPECS)


# --------------------------------------------------------------------------- native formats


def test_qwen_native_calls_with_surrounding_text() -> None:
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>{"name": "list_rooms", "arguments": {}}</tool_call>'
    )
    result = parse_native_tool_call(text, "qwen", SPECS)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("list_rooms", {}),
    ]
    assert result.content == "Let me check."


def test_hermes_native_call_with_string_arguments() -> None:
    text = '<tool_call>\n{"arguments": "{\\"city\\": \\"Rome\\"}", "name": "get_weather"}\n</tool_call>'
    result = parse_native_tool_call(text, "hermes", SPECS)
    assert result.tool_calls[0].arguments == {"city": "Rome"}
    assert result.content is None


def test_llama_native_calls() -> None:
    text = '<function=get_weather>{"city": "Lima"}</function>\n<function=list_rooms>{}</function>'
    result = parse_native_tool_call(text, "llama", SPECS)
    assert [c.name for c in result.tool_calls] == ["get_weather", "list_rooms"]
    assert result.tool_calls[0].arguments == {"city": "Lima"}


def test_envelope_inside_native_tags_is_understood() -> None:
    text = f"<tool_call>{json.dumps(WEATHER_CALL)}</tool_call>"
    assert parse_native_tool_call(text, "qwen", SPECS).tool_calls[0].name == "get_weather"
    several = {"tool_calls": [BOOK_CALL, WEATHER_CALL]}
    text = f"<tool_call>{json.dumps(several)}</tool_call><tool_call>{json.dumps(WEATHER_CALL)}</tool_call>"
    calls = parse_native_tool_call(text, "qwen", SPECS).tool_calls
    assert [c.name for c in calls] == ["book_room", "get_weather", "get_weather"]


def test_generic_native_is_the_envelope() -> None:
    assert parse_native_tool_call(json.dumps(WEATHER_CALL), "generic", SPECS).kind == "tool_calls"


def test_native_output_without_calls_is_text() -> None:
    result = parse_native_tool_call("Just words.", "qwen", SPECS)
    assert (result.kind, result.content, result.tool_calls) == ("text", "Just words.", ())


def test_native_arguments_are_validated_again() -> None:
    with pytest.raises(StructuredOutputInvalid) as err:
        parse_native_tool_call('<function=get_weather>{"city": 7}</function>', "llama", SPECS)
    assert err.value.pointer == "/tool_calls/0/arguments/city"


def test_native_unknown_family() -> None:
    with pytest.raises(ValueError, match="unknown tool-call family"):
        parse_native_tool_call("x", "mistral", SPECS)


def test_null_description_is_no_description() -> None:
    tool = function_tool("f")
    tool["function"]["description"] = None
    assert parse_tools_field([tool])[0].description == ""
    tool["function"]["description"] = 3
    with pytest.raises(InvalidTools) as err:
        parse_tools_field([tool])
    assert err.value.param == "tools[0].function.description"


def test_a_failure_at_the_root_is_named_so() -> None:
    """The root's JSON pointer is "" (RFC 6901); the message says "the root", not "/", which
    points at a key named ""."""
    with pytest.raises(StructuredOutputInvalid) as info:
        validate(1, {"type": "string"}, "1", param="response_format")
    assert info.value.pointer == "" and "fails its schema at the root:" in info.value.message
    assert info.value.param == "response_format"  # the field the caller names
    with pytest.raises(StructuredOutputInvalid) as info:
        validate({"a/b": 1}, {"properties": {"a/b": {"type": "string"}}}, "{}", param="tools")
    assert "fails its schema at '/a~1b':" in info.value.message


def test_a_schemas_own_metaschema_url_is_never_fetched() -> None:
    """`$schema` chose the metaschema jsonschema-rs checked against, so a request made the
    gateway fetch any URL (a socket that never answers held the event loop 30 s) or file."""
    import socket
    import time

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/internal?x=1"
        for metaschema in (url, "file:///etc/passwd"):
            started = time.perf_counter()
            check_schema({"$schema": metaschema, "type": "object"}, "p")
            assert time.perf_counter() - started < 1.0
        with pytest.raises(InvalidSchema, match="Invalid URI"):
            check_schema({"$schema": "not a uri", "type": "object"}, "p")
        listener.settimeout(0.1)
        with pytest.raises(TimeoutError):  # nobody connected
            listener.accept()
    with pytest.raises(InvalidSchema):  # still Draft 2020-12's metaschema
        check_schema({"$schema": "http://json-schema.org/draft-07/schema#", "type": 5}, "p")


def test_a_pattern_python_cannot_read_is_refused() -> None:
    """The limits read patterns with Python's parser; one it cannot parse would count as no
    repetition and no lookaround. A Unicode property escape is read through a stand-in, so
    it hides nothing either."""
    with pytest.raises(InvalidSchema, match="does not compile"):
        check_schema({"type": "string", "pattern": "(?:a{999}){30}(?<x>b)"}, "p")
    readable = {"type": "string", "pattern": "(?:a{999}){30}\\p{L}"}
    check_schema(readable, "p")
    with pytest.raises(ConstraintTooComplex, match="max_regex_repeat"):
        check_constraint(Constraint.json_schema(readable))


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"type": "object", "properties": {"a": {"$ref": "#/properties/a", "deprecated": True}}},
        {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
        {"$ref": "#", "$defs": {"x": {"type": "string"}}},
    ],
    ids=["two-aliases", "annotated-self", "through-allOf", "root"],
)
def test_a_ref_loop_with_no_schema_in_it_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidSchema, match="leading back to itself"):
        check_schema(schema, "p")


def test_a_recursive_schema_with_content_is_not_a_loop() -> None:
    tree = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
    }
    check_schema(tree, "p")


def test_closing_keeps_keys_that_combinator_members_require() -> None:
    schema = {
        "type": "object",
        "properties": {"kind": {"enum": ["x", "y"]}},
        "anyOf": [{"required": ["x"]}, {"required": ["y"]}],
    }
    closed = closed_schema(schema)
    assert set(closed["properties"]) == {"kind", "x", "y"}
    assert accepts(closed, {"kind": "x", "x": 1}) and not accepts(closed, {"kind": "x"})


def test_closing_leaves_members_that_read_a_described_object_open() -> None:
    """Closed to their own keys, these members could never hold "name", which the object
    requires: every call was a 400 constraint_unsupported or a 422."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "anyOf": [
            {"properties": {"email": {"type": "string"}}, "required": ["email"]},
            {"allOf": [{"required": ["phone"]}]},  # a key required two levels down
        ],
    }
    closed = closed_schema(schema)
    assert list(closed["properties"]) == ["name", "email", "phone"]
    assert "additionalProperties" not in closed["anyOf"][0]
    assert accepts(closed, {"name": "Ann", "email": "a@b.c"})
    assert accepts(closed, {"name": "Ann", "phone": "12"})
    assert not accepts(closed, {"name": "Ann"})
    assert not accepts(closed, {"name": "Ann", "email": "a@b.c", "extra": 1})


def _composed_levels(levels: int, fan: int) -> dict[str, Any]:
    """Each level's object composes the next level ``fan`` times (allOf of the same $ref)."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "allOf": [{"$ref": f"#/$defs/d{i + 1}"} for _ in range(fan)],
            "properties": {f"p{i}": {"type": "string"}},
        }
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "object", "properties": {"z": {"type": "string"}}}
    return {
        "type": "object",
        "allOf": [{"$ref": "#/$defs/d0"}],
        "properties": {"x": {"type": "string"}},
        "$defs": defs,
    }


@pytest.mark.timeout(60)
def test_closing_reads_a_subschema_once_however_many_refs_name_it() -> None:
    """Read once per path, these 40 levels took 2^40 steps: an agent's 2 KB request held the
    gateway's event loop for minutes (9 levels of fan 4 passed every limit and took 2.7 s)."""
    closed = closed_schema(_composed_levels(40, fan=2))
    assert list(closed["properties"]) == ["x", *(f"p{i}" for i in range(40)), "z"]
    assert list(closed_schema(_composed_levels(12, fan=4))["properties"])[-1] == "z"


@pytest.mark.parametrize("shape", ["wide allOf", "many required keys"])
def test_objects_composing_too_much_in_place_are_refused_by_name(shape: str) -> None:
    """Every object re-reads what it composes and lists its keys again: 500 objects each
    composing one 500-member allOf (55 KB), or one $ref requiring 4,000 keys (60 KB: 2,000,000
    keys listed, 5 s and 550 MB), cost their product before the union's size refused them."""
    if shape == "wide allOf":
        defs: dict[str, Any] = {f"d{i}": {"required": ["a"]} for i in range(500)}
        defs["hub"] = {"allOf": [{"$ref": f"#/$defs/d{i}"} for i in range(500)]}
    else:
        defs = {"hub": {"required": [f"k{i}" for i in range(4000)]}}
    params = {
        "type": "object",
        "properties": {
            f"p{j}": {"properties": {}, "allOf": [{"$ref": "#/$defs/hub"}]} for j in range(500)
        },
        "$defs": defs,
    }
    tools = parse_tools_field([function_tool("f", {"type": "object"}), function_tool("g", params)])
    with pytest.raises(ConstraintTooComplex, match="compose more than 50,000") as caught:
        union_schema(tools, "required")
    assert caught.value.param == "tools[1].function.parameters"
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": params}}
    with pytest.raises(ConstraintTooComplex) as caught:
        plan_chat(ChatInput(messages=[{"role": "user", "content": "x"}], response_format=fmt))
    assert caught.value.param == "response_format.json_schema.schema"


def test_closing_never_reaches_into_not_or_if() -> None:
    """Closing the schema under ``not`` would make the whole accept more than the tool's
    own schema: here an "a" of 1 next to a "b"."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "not": {"properties": {"a": {"const": 1}}, "required": ["a"]},
        "if": {"properties": {"a": {"const": 2}}, "required": ["a"]},
        "then": {"required": ["b"]},
    }
    closed = closed_schema(schema)
    assert closed["not"] == schema["not"] and closed["if"] == schema["if"]
    for value in ({"a": 1, "b": 2}, {"a": 2}, {"a": 3, "c": 1}):
        assert not accepts(closed, value), value
    assert accepts(closed, {"a": 2, "b": 0}) and accepts(closed, {"a": 3})


PET_DEFS = {
    "Pet": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "Tag": {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]},
}
AGE = {"age": {"type": "integer"}}


@pytest.mark.parametrize(
    ("pet", "value", "closed"),
    [
        ({"allOf": [{"$ref": "#/$defs/Pet"}], "properties": AGE}, {"name": "Rex", "age": 3}, True),
        ({"$ref": "#/$defs/Pet", "properties": AGE}, {"name": "Rex", "age": 3}, True),
        (
            {"properties": AGE, "anyOf": [{"$ref": "#/$defs/Pet"}, {"$ref": "#/$defs/Tag"}]},
            {"tag": "x", "age": 3},
            True,
        ),
        # no properties of its own: open, as the same two members written inline leave it
        (
            {"allOf": [{"$ref": "#/$defs/Pet"}, {"$ref": "#/$defs/Tag"}]},
            {"name": "R", "tag": "x"},
            False,
        ),
    ],
    ids=["allOf-ref", "sibling-ref", "anyOf-refs", "allOf-two-refs"],
)
def test_closing_follows_refs_composed_in_place(
    pet: dict[str, Any], value: dict[str, Any], closed: bool
) -> None:
    """OpenAPI/Pydantic composition: closed to its own properties, and its ref's target
    closed to its own, the object could hold neither key set whole: a 400
    constraint_unsatisfiable for a valid schema, as tool parameters and as response_format.
    The target used alone (``other``) stays closed."""
    pet = {**pet, "required": ["age"]} if "properties" in pet else pet
    params = {
        "type": "object",
        "properties": {"pet": pet, "other": {"$ref": "#/$defs/Pet"}},
        "required": ["pet"],
        "$defs": PET_DEFS,
    }
    union = union_schema(parse_tools_field([function_tool("f", params)]), "required")
    for schema, kind in ((union, "tools"), (closed_schema(params), "json")):
        validate_constraint(Constraint.json_schema(schema, kind=kind))  # satisfiable
    for arguments, ok in [
        ({"pet": value}, True),
        ({"pet": {**value, "invented": 1}}, not closed),
        ({"pet": value, "other": {"name": "Rex", "age": 3}}, False),
    ]:
        assert accepts(union, {"tool": "f", "arguments": arguments}) is ok, arguments
        assert accepts(closed_schema(params), arguments) is ok, arguments
    assert accepts(params, {"pet": value})  # the client's own schema agrees


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"my base": {"$anchor": "Base", **PET_DEFS["Pet"]}}, "$ref": "#Base"},
        {"$defs": {"my base": PET_DEFS["Pet"]}, "$ref": "#/$defs/my%20base"},
        {"$defs": {"café": {"$anchor": "Base", **PET_DEFS["Pet"]}}, "allOf": [{"$ref": "#Base"}]},
    ],
    ids=["anchor-on-a-spaced-name", "percent-encoded-pointer", "non-ascii-name"],
)
def test_refs_whose_pointers_are_percent_encoded_are_followed_when_closing(
    schema: dict[str, Any],
) -> None:
    """A ref is a URI fragment: a name with a space or a non-ASCII letter is percent-encoded
    in it (and the union writes it so); closing did not decode it, kept the target closed
    and refused a value the client's schema accepts."""
    params = {"type": "object", **schema, "properties": {"age": {"type": "integer"}}}
    value = {"name": "Rex", "age": 3}
    assert accepts(params, value)
    assert accepts(closed_schema(params), value)
    assert not accepts(closed_schema(params), {**value, "invented": 1})


def test_a_ref_used_alone_keeps_its_target_closed() -> None:
    """A property's ``$ref``, a lone ``allOf`` member (Pydantic v1 beside a description) and
    an ``anyOf`` variant describe the object alone: the closed target is theirs."""
    params = {
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/Pet"},
            "b": {"allOf": [{"$ref": "#/$defs/Pet"}], "description": "a pet"},
            "c": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"$ref": "#/$defs/Tag"}]},
        },
        "$defs": PET_DEFS,
    }
    closed = closed_schema(params)
    assert set(closed["$defs"]) == {"Pet", "Tag"}
    for key in ("a", "b", "c"):
        assert accepts(closed, {key: {"name": "Rex"}})
        assert not accepts(closed, {key: {"name": "Rex", "invented": 1}}), key


def test_a_ref_composed_into_itself_ends() -> None:
    """A target whose open copy applies itself again in place is copied once."""
    params = {
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}},
                "anyOf": [{"$ref": "#/$defs/Node"}, {"required": ["v"]}],
            }
        },
    }
    closed = closed_schema(params)
    assert closed["$defs"]["Node"]["anyOf"][0] == {"$ref": "#/$defs/Node-open"}
    assert closed["$defs"]["Node-open"]["anyOf"][0] == {"$ref": "#/$defs/Node-open"}
