"""runtime.renderers: each family's tool prompt, its past calls and its tool-result framing."""

from __future__ import annotations

import json

import pytest
from tool_samples import TOOLS, WEATHER_PARAMS

from runtime.engines.base import ChatMessage
from runtime.renderers import (
    HistoryCall,
    HistoryMessage,
    ToolPrompt,
    detect_family,
    get_renderer,
)
from runtime.tools import ResponseFormat, ToolChoice, parse_tools_field

SPECS = parse_tools_field(TOOLS)
WEATHER = SPECS[:1]
CALL = HistoryCall("call_" + "a" * 24, "get_weather", {"city": "Paris"})
CALL2 = HistoryCall("call_" + "b" * 24, "list_rooms", {})
HISTORY = (
    HistoryMessage("system", "Be brief."),
    HistoryMessage("user", "Weather in Paris? And rooms?"),
    HistoryMessage("assistant", "", tool_calls=(CALL, CALL2)),
    HistoryMessage("tool", "18C", tool_call_id=CALL.id, name="get_weather"),
    HistoryMessage("tool", "[101]", tool_call_id=CALL2.id, name="list_rooms"),
    HistoryMessage("assistant", "18C and room 101."),
)


AUTO = ToolChoice("auto")


def prompt(choice: ToolChoice = AUTO, parallel: bool = False) -> ToolPrompt:
    return ToolPrompt(WEATHER, choice, parallel)


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen"),
        ("Qwen/Qwen3-0.6B", "qwen"),
        ("/models/qwen2.5-coder/", "qwen"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama"),
        ("meta-llama/Llama-3.2-1B-Instruct", "llama"),
        ("llama3.2:3b", "llama"),
        ("NousResearch/Hermes-2-Pro-Llama-3-8B", "hermes"),
        ("NousResearch/Hermes-2-Pro-Mistral-7B", "hermes"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "generic"),
        ("smollm2", "generic"),
        ("meta-llama/Llama-2-7b-chat-hf", "generic"),
        ("", "generic"),
    ],
)
def test_detect_family(model: str, family: str) -> None:
    assert detect_family(model) == family


def test_qwen_tool_block_is_the_chat_template_text() -> None:
    tool_line = json.dumps(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": WEATHER_PARAMS,
            },
        }
    )
    assert get_renderer("qwen").tool_block(prompt()) == (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tool_line}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def test_qwen_lists_one_tool_per_line() -> None:
    block = get_renderer("qwen").tool_block(ToolPrompt(SPECS, ToolChoice("auto")))
    listed = block.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in listed] == [
        "get_weather",
        "book_room",
        "list_rooms",
    ]


def test_qwen_history() -> None:
    messages = get_renderer("qwen").render(HISTORY, "TOOLS")
    assert messages == (
        ChatMessage("system", "Be brief.\n\nTOOLS"),
        ChatMessage("user", "Weather in Paris? And rooms?"),
        ChatMessage(
            "assistant",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "list_rooms", "arguments": {}}\n</tool_call>',
        ),
        ChatMessage(
            "user",
            "<tool_response>\n18C\n</tool_response>\n<tool_response>\n[101]\n</tool_response>",
        ),
        ChatMessage("assistant", "18C and room 101."),
    )


def test_hermes_framing_and_history() -> None:
    renderer = get_renderer("hermes")
    block = renderer.tool_block(prompt())
    assert block.startswith("You are a function calling AI model.")
    assert "Here are the available tools: <tools> {" in block
    assert '"title": "FunctionCall"' in block
    assert block.endswith(
        '<tool_call>\n{"arguments": <args-dict>, "name": <function-name>}\n</tool_call>'
    )
    messages = renderer.render(HISTORY)
    assert messages[2].content.startswith(
        '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>'
    )
    assert messages[3].content.split("\n")[:3] == [
        "<tool_response>",
        '{"name": "get_weather", "content": "18C"}',
        "</tool_response>",
    ]


def test_llama_tool_block_and_history() -> None:
    renderer = get_renderer("llama")
    block = renderer.tool_block(prompt())
    assert "Use the function 'get_weather' to 'Current weather for a city'" in block
    assert '<function=example_function_name>{"example_name": "example_value"}</function>' in block
    assert "start_tag => `<function`" in block and "end_tag => `</function>`" in block
    assert "- Only call one function at a time" in block
    assert "one per line" in renderer.tool_block(prompt(parallel=True))
    messages = renderer.render(HISTORY)
    assert messages[2].content == (
        '<function=get_weather>{"city": "Paris"}</function>\n<function=list_rooms>{}</function>'
    )
    assert messages[3] == ChatMessage(
        "user",
        f"Result of function get_weather (call id {CALL.id}):\n18C\n\n"
        f"Result of function list_rooms (call id {CALL2.id}):\n[101]",
    )


def test_generic_history_shows_the_envelope_and_the_call_ids() -> None:
    messages = get_renderer("generic").render(HISTORY)
    assert json.loads(messages[2].content) == {
        "tool_calls": [
            {"tool": "get_weather", "arguments": {"city": "Paris"}},
            {"tool": "list_rooms", "arguments": {}},
        ]
    }
    assert messages[3].content == (
        f"Tool result for {CALL.id} (get_weather): 18C\n"
        f"Tool result for {CALL2.id} (list_rooms): [101]"
    )
    single = get_renderer("generic").assistant_calls("", [CALL])
    assert json.loads(single) == {"tool": "get_weather", "arguments": {"city": "Paris"}}


@pytest.mark.parametrize(
    ("family", "turn"),
    [
        ("generic", '{"tool": "get_weather", "arguments": "{\\"city\\": \\"Par"}'),
        (
            "qwen",
            '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Par"}\n</tool_call>',
        ),
        (
            "hermes",
            '<tool_call>\n{"arguments": "{\\"city\\": \\"Par", "name": "get_weather"}\n</tool_call>',
        ),
        ("llama", '<function=get_weather>"{\\"city\\": \\"Par"</function>'),
    ],
)
def test_arguments_holding_no_object_are_written_as_a_json_string(family: str, turn: str) -> None:
    """A past call re-sent with arguments that are no JSON object (cut off, invalid) is written
    where its object would be as a JSON string, as the chat templates' tojson writes it."""
    cut = HistoryCall("call_y1", "get_weather", '{"city": "Par')
    assert get_renderer(family).assistant_calls("", [cut]) == turn


def test_generic_instructions_follow_tool_choice() -> None:
    generic = get_renderer("generic")
    auto = generic.tool_block(prompt())
    assert auto == (
        "You have access to these tools:\n"
        + json.dumps(
            {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": WEATHER_PARAMS,
            }
        )
        + "\n\nWhen a tool matches the request, call it with JSON: "
        '{"tool": "<tool name>", "arguments": {<arguments>}}\n'
        'When no tool matches, answer with JSON: {"answer": "<text>"}'
    )
    assert '{"tool_calls": [' in generic.tool_block(prompt(parallel=True))
    none = generic.tool_block(prompt(ToolChoice("none")))
    assert '"tool"' not in none and "answer the user directly" in none
    assert 'Answer with JSON: {"answer": "<text>"}' in none
    required = generic.tool_block(prompt(ToolChoice("required")))
    assert '"answer"' not in required and "must call at least one" in required
    structured = generic.tool_block(
        ToolPrompt(WEATHER, ToolChoice("auto"), False, ResponseFormat("json_schema", INTEGER))
    )
    assert '{"answer": <JSON matching this schema: {"type": "integer"}>}' in structured


INTEGER = {"type": "integer"}


@pytest.mark.parametrize("family", ["generic", "qwen", "llama", "hermes"])
def test_every_family_tells_the_model_what_the_answer_format_is_for(family: str) -> None:
    """response_format.json_schema.description (OpenAI: "used by the model to determine how to
    respond in the format"; pydantic-ai's output docstring) follows the tools, named by the
    format's name, wherever an answer may be given; none leaves the prompt as it was."""
    renderer = get_renderer(family)
    counted = ResponseFormat("json_schema", INTEGER, "Count", description="Rooms free today.")
    block = renderer.tool_block(ToolPrompt(WEATHER, AUTO, False, counted))
    assert block == (
        renderer.tool_block(
            ToolPrompt(WEATHER, AUTO, False, ResponseFormat("json_schema", INTEGER))
        )
        + '\n\nResponse format "Count": Rooms free today.'
    )
    required = ToolPrompt(WEATHER, ToolChoice("required"), False, counted)
    assert "Rooms free today." not in renderer.tool_block(required)  # no answer to describe


@pytest.mark.parametrize("family", ["qwen", "llama", "hermes"])
def test_families_without_an_answer_form_are_told_the_answer_schema(family: str) -> None:
    """A family's own tool format knows only calls; an answer instead of a call under a
    json_schema response_format is decoded to that schema, so the model is shown it (generic
    quotes it inside its envelope's answer form)."""
    renderer = get_renderer(family)
    counted = ResponseFormat("json_schema", INTEGER, "Count")
    block = renderer.tool_block(ToolPrompt(WEATHER, AUTO, False, counted))
    assert block == (
        renderer.announce(ToolPrompt(WEATHER, AUTO, False, counted))
        + "\n\nWhen you answer instead of calling a function, respond with a single JSON value"
        ' and nothing else. It must match this JSON schema:\n{"type": "integer"}'
    )
    as_object = ToolPrompt(WEATHER, AUTO, False, ResponseFormat("json_object", {"type": "object"}))
    assert renderer.tool_block(as_object).endswith(
        "When you answer instead of calling a function, respond with a single JSON object and"
        " nothing else."
    )
    free = renderer.tool_block(ToolPrompt(WEATHER, AUTO))
    assert "answer instead" not in free
    required = renderer.tool_block(ToolPrompt(WEATHER, ToolChoice("required"), False, counted))
    assert "answer instead" not in required and "integer" not in required


def test_tool_block_becomes_the_system_prompt_when_there_is_none() -> None:
    history = (HistoryMessage("user", "hi"),)
    assert get_renderer("qwen").render(history, "TOOLS") == (
        ChatMessage("system", "TOOLS"),
        ChatMessage("user", "hi"),
    )


def test_later_system_messages_are_kept_in_place() -> None:
    history = (
        HistoryMessage("user", "hi"),
        HistoryMessage("system", "Switch to French."),
        HistoryMessage("user", "bonjour"),
    )
    rendered = get_renderer("generic").render(history, "TOOLS")
    assert [m.role for m in rendered] == ["system", "user", "system", "user"]
    assert rendered[2].content == "Switch to French."


def test_unknown_renderer() -> None:
    with pytest.raises(ValueError, match="unknown renderer 'mistral'"):
        get_renderer("mistral")


def test_generic_named_choice_spells_out_the_tool() -> None:
    named = get_renderer("generic").tool_block(prompt(ToolChoice("named", "get_weather"), True))
    assert 'call it with JSON: {"tool": "get_weather", "arguments": {<arguments>}}' in named
    assert "You must call the function get_weather." in named
    assert '{"tool_calls": [{"tool": "get_weather", "arguments": {<arguments>}}, ...]}' in named
