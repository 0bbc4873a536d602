"""runtime.planning: an OpenAI chat request -> messages, one constraint, the bound schema,
and the parse of the model's output; every bad input is a typed error before generation."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest
from tool_samples import ANSWER_SCHEMA, TOOLS

from runtime.call_ids import CALL_ID_RE, CallIds
from runtime.constraint import Constraint
from runtime.engines.base import ChatMessage
from runtime.errors import (
    BackendCannotCompile,
    ConflictingConstraints,
    ConstraintTooComplex,
    InvalidGrammar,
    InvalidRegex,
    InvalidSchema,
    OutputLeftGrammar,
    RuntimeInputError,
    StructuredOutputInvalid,
    UnknownTool,
    UnsupportedParameter,
)
from runtime.planning import ChatInput, Plan, plan_chat
from runtime.tools import ToolChoice
from runtime.union_schema import union_schema

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
RF_SCHEMA = {"type": "json_schema", "json_schema": {"name": "report", "schema": ANSWER_SCHEMA}}
CALL_ID = "call_" + "c" * 24
LOOP = [
    {"role": "developer", "content": "You are terse."},
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "content": [{"type": "text", "text": "18C"}]},
]


def plan(**fields: Any) -> Plan:
    fields.setdefault("messages", USER)
    return plan_chat(ChatInput(**fields))


# --------------------------------------------------------------------------- modes


def test_tools_mode_binds_the_union_schema() -> None:
    p = plan(tools=TOOLS, model="SmolLM2-135M-Instruct")
    assert p.mode == "tools" and p.renderer == "generic"
    assert p.constraint == Constraint.json_schema(p.schema, kind="tools")
    assert p.schema == union_schema(p.tools, "auto", None, True)  # OpenAI default: parallel
    assert p.tool_choice == ToolChoice("auto") and p.parallel_tool_calls
    assert p.messages[0].role == "system" and "get_weather" in p.messages[0].content


def test_json_schema_mode() -> None:
    p = plan(response_format=RF_SCHEMA)
    closed = {**ANSWER_SCHEMA, "additionalProperties": False}
    assert (p.mode, p.schema) == ("json", closed)
    assert p.constraint == Constraint.json_schema(closed)
    assert p.response_format is not None and p.response_format.schema == ANSWER_SCHEMA
    assert '"summary"' in p.messages[0].content  # the model is told the schema


def test_the_response_formats_description_is_told_to_the_model() -> None:
    """pydantic-ai's NativeOutput sends the output model's docstring as
    json_schema.description: it follows the schema in the system note, under the format's
    name, on the plain path and beside tools; the constraint and bound schema stay the same."""
    described = {
        "type": "json_schema",
        "json_schema": {**RF_SCHEMA["json_schema"], "description": "Summarise the weather."},
    }
    plain, with_description = plan(response_format=RF_SCHEMA), plan(response_format=described)
    assert with_description.messages[0].content == (
        plain.messages[0].content + '\n\nResponse format "report": Summarise the weather.'
    )
    assert (with_description.constraint, with_description.schema) == (
        plain.constraint,
        plain.schema,
    )
    for model in ("SmolLM2-135M-Instruct", "Qwen/Qwen2.5-7B-Instruct"):
        beside_tools = plan(tools=TOOLS, response_format=described, model=model)
        assert (
            'Response format "report": Summarise the weather.' in beside_tools.messages[0].content
        )
    none = plan(tools=TOOLS, tool_choice="none", response_format=described)
    assert none.messages[0].content == with_description.messages[0].content


def test_json_object_mode_binds_object() -> None:
    p = plan(response_format={"type": "json_object"})
    assert (p.mode, p.schema) == ("json", {"type": "object"})
    assert p.constraint == Constraint.json_schema({"type": "object"})


def test_regex_and_ebnf_bind_the_constraint_itself() -> None:
    r = plan(regex=r"\d{3}-\d{4}")
    assert (r.mode, r.schema, r.constraint) == ("regex", None, Constraint.regex(r"\d{3}-\d{4}"))
    g = plan(grammar='root ::= "yes" | "no"')
    assert (g.mode, g.schema, g.constraint) == (
        "ebnf",
        None,
        Constraint.ebnf('root ::= "yes" | "no"'),
    )


def test_text_mode_has_no_constraint() -> None:
    p = plan(response_format={"type": "text"})
    assert (p.mode, p.constraint, p.schema) == ("text", None, None)
    assert p.messages == (ChatMessage("user", USER[0]["content"]),)


def test_tool_choice_is_normalised() -> None:
    named = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "list_rooms"}})
    assert named.tool_choice == ToolChoice("named", "list_rooms")
    assert not named.parallel_tool_calls  # one call of the named tool, as OpenAI's forced function
    none = plan(tools=TOOLS, tool_choice="none", parallel_tool_calls=False)
    assert (none.mode, none.constraint, none.schema) == ("text", None, None)  # as without tools
    assert "get_weather" not in none.messages[0].content  # no tools to answer from
    structured = plan(tools=TOOLS, tool_choice="none", response_format=RF_SCHEMA)
    assert structured.mode == "json" and structured.schema is not None
    with pytest.raises(RuntimeInputError) as info:  # still read, though nothing is called
        plan(tools=TOOLS, tool_choice="none", parallel_tool_calls="yes")
    assert info.value.param == "parallel_tool_calls"


def test_family_override_and_detection() -> None:
    p = plan(tools=TOOLS, model="Qwen/Qwen2.5-0.5B-Instruct")
    assert p.renderer == "qwen" and "<tools>" in p.messages[0].content
    forced = plan_chat(ChatInput(USER, tools=TOOLS, model="Qwen2.5"), family="llama")
    assert forced.renderer == "llama" and "<function=" in forced.messages[0].content


# --------------------------------------------------------------------------- thinking models


def test_plain_models_are_constrained_from_the_first_token() -> None:
    assert plan(tools=TOOLS, model="Qwen2.5-7B-Instruct").enforcement is None
    assert plan(response_format=RF_SCHEMA, model="SmolLM2-135M-Instruct").enforcement is None


def test_thinking_model_auto_is_triggered_on_the_tool_call_tag() -> None:
    p = plan(tools=TOOLS, model="Qwen/Qwen3-8B")
    assert p.enforcement is not None
    assert (p.enforcement.mode, p.enforcement.reasoning) == ("triggered", True)
    assert p.enforcement.trigger_start == "<tool_call>"
    # only a call may stand inside the tag: the constraint has no answer branch
    assert p.constraint == Constraint.json_schema(
        union_schema(p.tools, "required", None, True), kind="tools"
    )
    free = p.parse("<think>Paris? maybe.</think>It is sunny, no tool needed.")
    assert free.kind == "answer" and free.reasoning == "Paris? maybe."
    called = p.parse(
        '<think>x</think><tool_call>{"tool": "get_weather", "arguments": '
        '{"city": "Paris"}}</tool_call>'
    )
    assert [c.name for c in called.tool_calls] == ["get_weather"]
    with pytest.raises(StructuredOutputInvalid):  # a cut-off call is not an answer
        p.parse('<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_')


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"tools": TOOLS, "response_format": RF_SCHEMA},  # the answer itself is constrained
        {"response_format": RF_SCHEMA},
        {"regex": "[a-z]+"},
    ],
)
def test_thinking_model_is_constrained_after_the_thinking_region(fields: dict[str, Any]) -> None:
    p = plan(model="QwQ-32B", **fields)
    assert p.enforcement is not None
    assert (p.enforcement.mode, p.enforcement.reasoning) == ("always", True)


def test_reasoning_override() -> None:
    assert (
        plan_chat(ChatInput(USER, tools=TOOLS, model="Qwen3-8B"), reasoning=False).enforcement
        is None
    )
    forced = plan_chat(ChatInput(USER, regex="[a-z]+", model="SmolLM2"), reasoning=True)
    assert forced.enforcement is not None and forced.enforcement.mode == "always"
    assert plan_chat(ChatInput(USER, model="SmolLM2"), reasoning=True).enforcement is None


def test_planning_is_deterministic() -> None:
    chat = ChatInput(LOOP, tools=TOOLS, response_format=RF_SCHEMA, model="qwen3")
    assert plan_chat(chat) == plan_chat(chat)


# --------------------------------------------------------------------------- conflicts


@pytest.mark.parametrize(
    ("fields", "first", "second"),
    [
        ({"response_format": RF_SCHEMA, "regex": "a+"}, "response_format", "regex"),
        (
            {"response_format": {"type": "json_object"}, "grammar": "root ::= x"},
            "response_format",
            "grammar",
        ),
        ({"regex": "a+", "grammar": "root ::= x"}, "regex", "grammar"),
        ({"tools": TOOLS, "regex": "a+"}, "tools", "regex"),
        ({"tools": TOOLS, "grammar": "root ::= x"}, "tools", "grammar"),
    ],
)
def test_two_constraints_conflict(fields: dict[str, Any], first: str, second: str) -> None:
    with pytest.raises(ConflictingConstraints) as err:
        plan(**fields)
    assert f"'{first}'" in err.value.message and f"'{second}'" in err.value.message
    assert err.value.param == second
    assert err.value.code == "conflicting_constraints"


def test_text_response_format_does_not_conflict() -> None:
    assert plan(response_format={"type": "text"}, regex="a+").mode == "regex"


def test_tools_with_response_format_answer_with_the_schema() -> None:
    p = plan(tools=TOOLS, response_format=RF_SCHEMA)
    assert p.mode == "tools" and p.answer_schema == ANSWER_SCHEMA
    result = p.parse(json.dumps({"answer": {"summary": "sunny", "score": 0.9}}))
    assert (result.kind, result.parsed) == ("parsed", {"summary": "sunny", "score": 0.9})
    calls = p.parse('{"tool": "get_weather", "arguments": {"city": "Paris"}}')
    assert calls.kind == "tool_calls" and calls.parsed is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice"),
        ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    ],
)
def test_tool_options_need_tools(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RuntimeInputError, match="only allowed when 'tools' are specified") as err:
        plan(**fields)
    assert err.value.param == param


def test_unknown_named_tool() -> None:
    with pytest.raises(UnknownTool, match="available: get_weather, book_room, list_rooms"):
        plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})


def test_parallel_flag_must_be_boolean() -> None:
    with pytest.raises(RuntimeInputError) as err:
        plan(tools=TOOLS, parallel_tool_calls="yes")
    assert err.value.param == "parallel_tool_calls"


# --------------------------------------------------------------------------- response_format


@pytest.mark.parametrize(
    ("response_format", "error", "param"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "r"}},
            InvalidSchema,
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "objekt"}}},
            InvalidSchema,
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name", "schema": {}}},
            InvalidSchema,
            "response_format.json_schema.name",
        ),
        ({"type": "json_schema"}, InvalidSchema, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": {}, "description": 3}},
            InvalidSchema,
            "response_format.json_schema.description",
        ),
        ({"type": "yaml"}, RuntimeInputError, "response_format.type"),
        ("json", RuntimeInputError, "response_format"),
    ],
)
def test_bad_response_format(response_format: Any, error: type[Exception], param: str) -> None:
    with pytest.raises(error) as err:
        plan(response_format=response_format)
    assert err.value.param == param


def test_strict_response_format_is_recorded() -> None:
    rf = {
        "type": "json_schema",
        "json_schema": {"name": "r", "schema": ANSWER_SCHEMA, "strict": True},
    }
    p = plan(response_format=rf)
    assert p.response_format is not None and p.response_format.strict
    assert p.schema == {**ANSWER_SCHEMA, "additionalProperties": False}
    with pytest.raises(StructuredOutputInvalid):
        p.parse('{"summary": "x", "score": 1, "extra": true}')
    with pytest.raises(StructuredOutputInvalid, match="names the key 'score' twice") as err:
        p.parse('{"summary": "x", "score": 1, "score": 0}')  # the grammars let this through
    assert err.value.param == "response_format"


def test_regex_output_is_checked_again_after_decoding() -> None:
    """The regex is checked on the output as the JSON schema is, so a backend that enforced
    less than all of it (or output cut by max_tokens) is a 422, never a receipt saying valid."""
    r = plan(regex=r"\d{3}-\d{4}")
    assert r.parse("555-0100").content == "555-0100"
    for output in ("555-010", "akafwa 555-0100"):
        with pytest.raises(StructuredOutputInvalid) as info:
            r.parse(output)
        assert info.value.param == "regex" and info.value.raw_output == output


def test_grammar_output_is_read_again_where_llguidance_enforced_it() -> None:
    """vLLM's guidance backend, past llguidance's item limit mid-output, ended the output
    there with finish_reason "stop", and the receipt said valid: llguidance's own reading of
    the output (byte by byte) now makes that a 422. xgrammar reads some grammars otherwise
    ([a-z]+ "ing" admits "singing" there, not in llguidance's lexer): its output is not
    read again."""
    g = plan(grammar='root ::= "hello" ' + " ".join(["[a-z ]*"] * 60) + ' "!"')
    assert g.parse("hello there!", enforced_by="guidance").content == "hello there!"
    for backend in ("guidance", "llguidance"):
        with pytest.raises(StructuredOutputInvalid, match="ends before the grammar") as info:
            g.parse("hello", enforced_by=backend)
        assert info.value.param == "grammar" and info.value.raw_output == "hello"
    assert g.parse("hello", enforced_by="xgrammar").content == "hello"
    assert g.parse("hello", enforced_by="guidance", cut=True).complete is False
    assert g.parse("hello wor\ufffd", enforced_by="guidance", cut=True).complete is False
    # cut short, output that left the grammar is still a 422, however it is parsed: no more
    # text could have made it the grammar's (it was returned as cut off, receipted)
    from runtime.streaming import EnvelopeStreamDecoder, parse_output

    decoder = EnvelopeStreamDecoder(g)
    decoder.feed("hellO!")
    for parse in (
        lambda: g.parse("hellO!", enforced_by="guidance", cut=True),
        lambda: parse_output(g, "hellO!", cut=True, enforced_by="guidance"),
        lambda: decoder.finish(cut=True, enforced_by="guidance"),
    ):
        with pytest.raises(OutputLeftGrammar, match="from character 4"):
            parse()
    singing = plan(grammar='start: /[a-z]+/ "ing"')
    assert singing.parse("singing", enforced_by="xgrammar").content == "singing"
    with pytest.raises(StructuredOutputInvalid):
        singing.parse("singing", enforced_by="llguidance")
    thinking = plan(grammar='start: "yes" | "no"', model="Qwen3-8B")
    assert thinking.parse("<think>hm</think>yes", enforced_by="guidance").content == "yes"
    # a model that does not think: the grammar held from the first token, <think> included
    tagged = plan(grammar='start: "<think>" /[a-z]+/ "</think>" ("yes" | "no")')
    tagged.parse("<think>hm</think>yes", enforced_by="llguidance")
    with pytest.raises(OutputLeftGrammar):
        tagged.parse("yes", enforced_by="llguidance")


def test_grammar_output_is_not_read_again_where_bytes_are_not_its_tokens() -> None:
    """A rule's attributes (a hidden stop string, a token count) are about the model's
    tokens and text the output does not hold: such a grammar is left to its backend."""
    stop = plan(grammar='start: "a" x "b"\nx[stop="."]: /[a-z]*/')
    assert stop.parse("aqqb", enforced_by="guidance").content == "aqqb"


def test_grammar_output_past_the_readers_limits_is_refused_not_vouched_for() -> None:
    wide = plan(grammar='root ::= [a-z]* "b" ' + " ".join(["[a-z]*"] * 400) + ' "c"')
    with pytest.raises(ConstraintTooComplex, match="too costly to check") as info:
        wide.parse("abc", enforced_by="llguidance")
    assert info.value.status == 400 and info.value.param == "grammar"


def test_formats_are_checked_after_decoding() -> None:
    """Decoders enforce a format's shape, not its meaning: llguidance wrote 2023-02-29 and
    xgrammar 2023-02-31 for a "date"; such output is a 422, not a 200 whose call fails."""
    schema = {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}}
    p = plan(
        response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": schema}}
    )
    assert p.parse('{"day": "2024-02-29"}').content == '{"day": "2024-02-29"}'
    for day in ("2023-02-29", "2023-02-31"):
        with pytest.raises(StructuredOutputInvalid, match='is not a "date"'):
            p.parse(f'{{"day": "{day}"}}')


def test_a_backtracking_regex_check_has_a_deadline() -> None:
    """(a|aa){40}b on 44 a's takes Python's engine about 45 s; the check runs on the event
    loop, so it gives up in REGEX_CHECK_TIMEOUT_S and fails closed."""
    from runtime.planning import REGEX_CHECK_TIMEOUT_S

    r = plan(regex="(a|aa){40}b")
    started = time.perf_counter()
    with pytest.raises(StructuredOutputInvalid) as info:
        r.parse("a" * 44)
    assert time.perf_counter() - started < REGEX_CHECK_TIMEOUT_S + 0.5
    assert "could not be checked against the regex" in info.value.message


def test_invalid_regex_and_grammar() -> None:
    with pytest.raises(InvalidRegex) as err:
        plan(regex="(unclosed")
    assert err.value.param == "regex"
    with pytest.raises(InvalidRegex):
        plan(regex="")
    with pytest.raises(InvalidGrammar):
        plan(grammar="   ")


def test_a_repetition_with_no_lower_bound_is_refused_saying_how_to_write_it() -> None:
    """Python reads a{,3} as a{0,3}; llguidance and xgrammar do not parse it, and their
    refusals named their parsers' insides (vLLM's a 400 quoting xgrammar's C++ file)."""
    with pytest.raises(InvalidRegex, match=r"\{,3\}, .* write \{0,3\}") as err:
        plan(regex="[a-z]{,3}")
    assert err.value.param == "regex"
    assert plan(regex="a\\{,3}|[{,3}]").constraint is not None  # an escaped brace, a class


POSSESSIVE = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^[0-9]{1,2}+[0-9]$"}},
    "required": ["a"],
}


@pytest.mark.parametrize(
    ("fields", "param", "construct"),
    [
        ({"regex": "[ab]++b"}, "regex", "a possessive quantifier"),
        ({"regex": "x?+x"}, "regex", "a possessive quantifier"),
        ({"regex": "(?>ab)c"}, "regex", "an atomic group"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "r", "schema": POSSESSIVE},
                }
            },
            "response_format.json_schema.schema",
            "a possessive quantifier",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": POSSESSIVE}}]},
            "tools[0].function.parameters",
            "a possessive quantifier",
        ),
    ],
    ids=["regex", "regex-optional", "regex-atomic", "response-format-pattern", "tool-pattern"],
)
def test_possessive_quantifiers_are_refused_before_decoding(
    fields: dict[str, Any], param: str, construct: str
) -> None:
    """Python's re and jsonschema-rs read x++ as possessive, llguidance as greedy: the
    output of [ab]++b failed the check (422), or never ended. A schema pattern would take the
    post-hoc path, decoding free, so it is refused as a regex is."""
    with pytest.raises(BackendCannotCompile) as info:
        plan(**fields)
    assert (info.value.code, info.value.param) == ("constraint_unsupported", param)
    assert construct in info.value.message


# --------------------------------------------------------------------------- messages


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hello", "messages"),
        (["hello"], "messages[0]"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "function", "content": "x", "name": "f"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([*USER, {"role": "tool", "content": "18C"}], "messages[1].tool_call_id"),
        *(
            (
                [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": arguments},
                            }
                        ],
                    }
                ],
                "messages[0].tool_calls[0].function.arguments",
            )
            # not strings, empty ones too (they read as {} before, as "" and a missing one do)
            for arguments in ({"a": 1}, {}, [], 0, False)
        ),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}],
            "messages[0].tool_calls[0]",
        ),
    ],
)
def test_bad_messages(messages: Any, param: str) -> None:
    with pytest.raises(RuntimeInputError) as err:
        plan(messages=messages)
    assert err.value.param == param


def test_non_text_content_parts_are_unsupported() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    with pytest.raises(UnsupportedParameter) as err:
        plan(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}])
    assert err.value.param == "messages[0].content[1].type"


def test_an_assistant_turn_may_hold_refusal_parts_a_user_turn_may_not() -> None:
    refusal = {"type": "refusal", "refusal": "I cannot help with that."}
    said = plan(messages=[USER[0], {"role": "assistant", "content": [refusal]}, USER[0]])
    assert said.messages[-2] == ChatMessage("assistant", "I cannot help with that.")
    with pytest.raises(UnsupportedParameter) as err:
        plan(messages=[{"role": "user", "content": [refusal]}])
    assert err.value.param == "messages[0].content[0].type"
    with pytest.raises(RuntimeInputError) as err:
        plan(messages=[{"role": "assistant", "content": [{"type": "refusal"}]}, USER[0]])
    assert err.value.param == "messages[0].content[0].refusal"


def test_text_parts_and_developer_role() -> None:
    p = plan(
        messages=[
            {"role": "developer", "content": "Rules."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    assert p.messages == (ChatMessage("system", "Rules."), ChatMessage("user", "a\nb"))


def test_agent_loop_history_is_rendered_and_answered_ids_exposed() -> None:
    p = plan(messages=LOOP, tools=TOOLS, model="SmolLM2")
    assert p.tool_call_ids_answered == (CALL_ID,)
    roles = [m.role for m in p.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert p.messages[0].content.startswith("You are terse.\n\nYou have access to these tools:")
    assert json.loads(p.messages[2].content) == {
        "tool": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert p.messages[3].content == f"Tool result for {CALL_ID} (get_weather): 18C"


def test_unknown_tool_call_id_is_still_answered() -> None:
    """Linking is the gateway's job: an id nobody issued is recorded, not rejected."""
    p = plan(messages=[*USER, {"role": "tool", "tool_call_id": "call_x", "content": "?"}])
    assert p.tool_call_ids_answered == ("call_x",)
    assert p.messages[-1].content == "Tool result for call_x (unknown tool): ?"


# --------------------------------------------------------------------------- parse


def test_parse_tool_call_with_stable_ids() -> None:
    p = plan(tools=TOOLS)
    ids = CallIds()
    text = '{"tool_calls": [{"tool": "list_rooms", "arguments": {}}, {"tool": "get_weather", "arguments": {"city": "Oslo"}}]}'
    first, again = p.parse(text, ids), p.parse(text, ids)
    assert [c.name for c in first.tool_calls] == ["list_rooms", "get_weather"]
    assert all(CALL_ID_RE.fullmatch(c.id) for c in first.tool_calls)
    assert first == again


def test_parse_enforces_tool_choice() -> None:
    named = plan(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "list_rooms"}})
    with pytest.raises(StructuredOutputInvalid):
        named.parse('{"tool": "get_weather", "arguments": {"city": "Oslo"}}')
    required = plan(tools=TOOLS, tool_choice="required")
    with pytest.raises(StructuredOutputInvalid):
        required.parse('{"answer": "no"}')
    as_text = plan(tools=TOOLS, tool_choice="none").parse('{"tool": "list_rooms"}')
    assert (as_text.kind, as_text.tool_calls) == ("text", ())  # tool_choice "none" calls nothing


def test_a_bad_tool_call_names_tools_and_a_bad_answer_response_format() -> None:
    p = plan(tools=TOOLS, response_format=RF_SCHEMA)
    with pytest.raises(StructuredOutputInvalid) as call:
        p.parse('{"tool": "get_weather", "arguments": {"city": 7}}')
    assert call.value.param == "tools"
    with pytest.raises(StructuredOutputInvalid) as answer:
        p.parse('{"answer": {"summary": "ok", "score": "high"}}')
    assert answer.value.param == "response_format"


def test_parse_json_mode() -> None:
    p = plan(response_format=RF_SCHEMA)
    text = '{"summary": "ok", "score": 3}'
    result = p.parse(text)
    assert (result.kind, result.parsed, result.content) == (
        "parsed",
        {"summary": "ok", "score": 3},
        text,
    )
    with pytest.raises(StructuredOutputInvalid) as err:
        p.parse('{"summary": "ok", "score": "high"}')
    assert err.value.pointer == "/score" and err.value.schema == p.schema
    with pytest.raises(StructuredOutputInvalid):
        p.parse('{"summary": "ok", "sc')


def test_parse_text_and_regex_modes_pass_through() -> None:
    for p, text in ((plan(), "123 "), (plan(regex=r"\d+"), "123")):
        result = p.parse(text)
        assert (result.kind, result.content, result.tool_calls) == ("text", text, ())


def test_parse_strips_a_thinking_region() -> None:
    result = plan(tools=TOOLS).parse('<think>\nuser wants weather\n</think>\n{"answer": "Hi"}')
    assert (result.kind, result.answer, result.reasoning) == ("answer", "Hi", "user wants weather")


def test_parse_tagged_calls_from_a_triggered_region() -> None:
    """Thinking models with tool_choice auto: free text, then a constrained tagged call."""
    qwen = plan(tools=TOOLS, model="Qwen3-8B")
    text = '<think>ok</think>Checking.\n<tool_call>\n{"tool": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    result = qwen.parse(text)
    assert result.tool_calls[0].arguments == {"city": "Rome"} and result.content == "Checking."
    plain = qwen.parse("It is sunny.")
    assert (plain.kind, plain.answer) == ("answer", "It is sunny.")
    with pytest.raises(StructuredOutputInvalid):
        plan(tools=TOOLS, tool_choice="required", model="Qwen3-8B").parse("No call here.")
    llama = plan(tools=TOOLS, model="Llama-3.2-3B-Instruct")
    assert llama.parse("<function=list_rooms>{}</function>").tool_calls[0].name == "list_rooms"


def test_every_parsed_call_validates_against_its_tool() -> None:
    p = plan(tools=TOOLS)
    result = p.parse('{"tool": "book_room", "arguments": {"guest": {"name": "Ada"}, "nights": 3}}')
    (call,) = result.tool_calls
    spec = next(t for t in p.tools if t.name == call.name)
    jsonschema.validate(call.arguments, spec.parameters)
    with pytest.raises(StructuredOutputInvalid) as err:
        p.parse('{"tool": "book_room", "arguments": {"guest": {"name": "Ada"}, "nights": 99}}')
    assert err.value.pointer == "/arguments/nights"


def test_a_tool_message_may_name_its_function() -> None:
    """Older clients send the function name on the tool message instead of a prior call."""
    legacy = {"role": "tool", "tool_call_id": "call_y", "name": "get_weather", "content": "9C"}
    p = plan(messages=[*USER, legacy])
    assert p.messages[-1].content == "Tool result for call_y (get_weather): 9C"


@pytest.mark.parametrize("depth", [100, 450])
def test_a_schema_too_deep_for_the_metaschema_check_is_a_400(depth: int) -> None:
    """jsonschema's check recurses per level; the stack running out is the client's limit,
    not a 500 (with a traceback the size of the schema in the log)."""
    nested: dict[str, Any] = {}
    for _ in range(depth):
        nested = {"type": "object", "properties": {"a": nested}}
    tools = [{"type": "function", "function": {"name": "t", "parameters": nested}}]
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": nested}}
    for chat in (ChatInput(USER, tools=tools), ChatInput(USER, response_format=rf)):
        with pytest.raises(ConstraintTooComplex) as info:
            plan_chat(chat)
        assert info.value.status == 400 and "max_schema_depth" in info.value.message


def test_an_earlier_call_with_empty_arguments_reads_as_no_arguments() -> None:
    """A tool without parameters is often replayed with arguments "" (LangChain, converted
    histories): that is {}, not a 400."""
    call = {"id": "c1", "type": "function", "function": {"name": "list_rooms", "arguments": ""}}
    planned = plan(
        messages=[
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "none free"},
        ]
    )
    assert planned.tool_call_ids_answered == ("c1",)
    assert any("list_rooms" in m.content for m in planned.messages)


@pytest.mark.parametrize(
    "arguments",
    ['{"city": "Par', "[1, 2]", "null", "not json at all", "[" * 100_000 + "]" * 100_000],
    ids=["cut-off", "array", "null", "text", "deep"],
)
def test_an_earlier_call_whose_arguments_hold_no_object_is_prompt_text(arguments: str) -> None:
    """OpenAI types a past call's arguments as any string, and LangChain re-sends an invalid
    call's raw arguments: the string is shown to the model as it was written (a JSON string
    where the template wants an object), and the tool result still answers the call by id."""
    call = {"id": "call_y1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": arguments}
    planned = plan(
        messages=[
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_y1", "content": "error: invalid arguments"},
        ],
        tools=TOOLS,
        model="SmolLM2",
    )
    assert planned.tool_call_ids_answered == ("call_y1",)
    shown = json.loads(planned.messages[2].content)
    assert shown == {"tool": "get_weather", "arguments": arguments}
    assert planned.messages[3].content.startswith("Tool result for call_y1 (get_weather):")


def test_message_members_clients_echo_back() -> None:
    """The SDK's response message, appended as is, carries refusal/function_call/audio as
    null: accepted. A refusal is what that turn said; legacy function_call and audio are
    refused by name rather than dropped."""
    echoed = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    planned = plan(messages=[*USER, {**echoed, "function_call": None, "audio": None}, *USER])
    assert any("I can't help with that." in m.content for m in planned.messages)
    for member in ("function_call", "audio"):
        with pytest.raises(UnsupportedParameter) as err:
            plan(messages=[*USER, {**echoed, member: {"name": "f", "arguments": "{}"}}])
        assert err.value.param == f"messages[1].{member}"
