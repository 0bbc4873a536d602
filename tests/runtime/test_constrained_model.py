"""The real SmolLM2 under every kind of constraint, 20 varied prompts each.

Unconstrained, this 135M model ignores "answer in JSON"; under the grammar every output must
parse and validate, checked independently of the backend that enforced it: jsonschema for
JSON and the tool union, ``re.fullmatch`` for regexes, the Lark parser for EBNF grammars.
Greedy decoding keeps every case deterministic. Schemas bound their strings and numbers so
every answer completes within the small token budgets that keep this suite to minutes.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import lark
import pytest
from embedded_model import run, shared_engine

from runtime.engines.base import Generation, Sampling
from runtime.engines.embedded import EmbeddedEngine
from runtime.output_parsing import ParsedResponse
from runtime.planning import ChatInput, plan_chat

pytestmark = pytest.mark.model


@pytest.fixture(scope="session")
def engine() -> EmbeddedEngine:
    return shared_engine()


def chat(prompt: str) -> list[dict[str, str]]:
    """A terse agent persona keeps free-text answers inside the small token budgets."""
    return [{"role": "system", "content": BRIEF}, {"role": "user", "content": prompt}]


BRIEF = "Be brief: answer in at most ten words."


def planned(engine: EmbeddedEngine, prompt: str, max_tokens: int, **request: Any) -> str:
    """One request as the gateway plans it (prompt rendering, one constraint); the text must
    end because the grammar completed, not because the token budget ran out."""
    plan = plan_chat(ChatInput(messages=chat(prompt), model=engine.identity.model, **request))
    assert plan.constraint is not None
    result: Generation = run(
        engine.generate(plan.messages, plan.constraint, Sampling(max_tokens=max_tokens))
    )
    assert result.backend != "none" and result.fallback is None
    assert result.finish_reason == "stop", f"truncated at {max_tokens} tokens: {result.text!r}"
    return result.text


# --------------------------------------------------------------------------- JSON schema

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 24},
        "temperature": {"type": "integer", "minimum": -60, "maximum": 60},
        "sky": {"enum": ["sunny", "cloudy", "rainy", "snowy"]},
    },
    "required": ["city", "temperature", "sky"],
    "additionalProperties": False,
}
VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 24},
    },
    "required": ["answer", "reason"],
    "additionalProperties": False,
}
SHOPPING = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 16},
            "minItems": 1,
            "maxItems": 3,
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}

JSON_CASES = [
    (PERSON, "Alice is a 34 year old engineer from Lyon. Extract her name and age."),
    (PERSON, "Describe a fictional pirate captain."),
    (PERSON, "Who wrote Hamlet, and how old was he when he died?"),
    (PERSON, "My grandfather Tomas just turned 90."),
    (PERSON, "Invent a character for a children's book."),
    (WEATHER, "It is 21 degrees and sunny in Madrid today."),
    (WEATHER, "Give me a weather report for Oslo in January."),
    (WEATHER, "What is the weather like in Tokyo right now?"),
    (WEATHER, "Heavy rain in London, 12 degrees."),
    (WEATHER, "Describe a typical summer day in Cairo."),
    (VERDICT, "Is the earth flat?"),
    (VERDICT, "Is water wet?"),
    (VERDICT, "Can penguins fly?"),
    (VERDICT, "Is 17 a prime number?"),
    (VERDICT, "Should I bring an umbrella if the sky is clear?"),
    (SHOPPING, "I want to bake a cake. What should I buy?"),
    (SHOPPING, "List what I need for a picnic."),
    (SHOPPING, "We are out of milk and eggs."),
    (SHOPPING, "Plan groceries for a taco night."),
    (SHOPPING, "What do I need to paint a room?"),
]


@pytest.mark.parametrize(("schema", "prompt"), JSON_CASES)
def test_json_schema_output_validates(
    engine: EmbeddedEngine, schema: dict[str, Any], prompt: str
) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    text = planned(engine, prompt, 64, response_format=response_format)
    jsonschema.validate(json.loads(text), schema)


# --------------------------------------------------------------------------- regex

REGEX_CASES = [
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "When did the Berlin wall fall? Give the date."),
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "What is today's date?"),
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "When is Christmas in 2030?"),
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "Pick a date for our next meeting."),
    (r"([01][0-9]|2[0-3]):[0-5][0-9]", "What time does the train leave?"),
    (r"([01][0-9]|2[0-3]):[0-5][0-9]", "When do you usually eat lunch?"),
    (r"([01][0-9]|2[0-3]):[0-5][0-9]", "Set an alarm for half past six in the evening."),
    (r"(yes|no)", "Is the sun a star?"),
    (r"(yes|no)", "Do fish breathe air?"),
    (r"(yes|no)", "Would you like some tea?"),
    (r"[0-9]{3}-[0-9]{3}-[0-9]{4}", "What is the phone number of the pizza place?"),
    (r"[0-9]{3}-[0-9]{3}-[0-9]{4}", "Make up a phone number for a fictional company."),
    (r"[A-Z][a-z]{2,11}", "What is the capital of Italy?"),
    (r"[A-Z][a-z]{2,11}", "Name a planet in our solar system."),
    (r"[A-Z][a-z]{2,11}", "What is a good name for a dog?"),
    (r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)", "What is the support email address?"),
    (r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)", "Invent an email address for Bob."),
    (r"([0-9]{1,3}\.){3}[0-9]{1,3}", "What is the IP address of the local router?"),
    (r"#[0-9a-f]{6}", "Give me the hex color code of bright red."),
    (r"-?[0-9]{1,4}", "How many legs does a spider have?"),
]


@pytest.mark.parametrize(("pattern", "prompt"), REGEX_CASES)
def test_regex_output_matches(engine: EmbeddedEngine, pattern: str, prompt: str) -> None:
    text = planned(engine, prompt, 24, regex=pattern)
    assert re.fullmatch(pattern, text), text


# --------------------------------------------------------------------------- EBNF

COMMANDS = r"""
start: move | say | wait
move: "move " DIRECTION " " DIGIT
say: "say " WORD
wait: "wait " DIGIT " seconds"
DIRECTION: "north" | "south" | "east" | "west"
DIGIT: /[1-9]/
WORD: /[a-z]{1,12}/
"""
ARITHMETIC = r"""
start: NUMBER " " OP " " NUMBER " = " NUMBER
OP: "+" | "-" | "*"
NUMBER: /[0-9]{1,4}/
"""

EBNF_CASES = [
    (COMMANDS, "The robot should walk three steps to the north."),
    (COMMANDS, "Tell the robot to greet everyone."),
    (COMMANDS, "Make the robot pause for a moment."),
    (COMMANDS, "Go east, quickly!"),
    (COMMANDS, "What should the robot do next?"),
    (COMMANDS, "The robot must say goodbye."),
    (COMMANDS, "Retreat south by two squares."),
    (COMMANDS, "Give the robot a command."),
    (COMMANDS, "Wait five seconds before continuing."),
    (COMMANDS, "Head west."),
    (ARITHMETIC, "What is two plus two?"),
    (ARITHMETIC, "Multiply 12 by 3."),
    (ARITHMETIC, "Subtract 7 from 100."),
    (ARITHMETIC, "Write an addition."),
    (ARITHMETIC, "How much is 15 times 4?"),
    (ARITHMETIC, "I had 40 apples and ate 5."),
    (ARITHMETIC, "Add 250 and 750."),
    (ARITHMETIC, "Show me a multiplication."),
    (ARITHMETIC, "What is 9 minus 9?"),
    (ARITHMETIC, "Double 21."),
]


@pytest.mark.parametrize(("grammar", "prompt"), EBNF_CASES)
def test_ebnf_output_parses(engine: EmbeddedEngine, grammar: str, prompt: str) -> None:
    text = planned(engine, prompt, 24, grammar=grammar)
    lark.Lark(grammar, parser="earley").parse(text)  # raises on any deviation


# --------------------------------------------------------------------------- tool union

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 30},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send a short email",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "string", "minLength": 3, "maxLength": 40},
                    "subject": {"type": "string", "minLength": 1, "maxLength": 40},
                },
                "required": ["to", "subject"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount of money between currencies",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "integer", "minimum": 0, "maximum": 1000000},
                    "source": {"enum": ["USD", "EUR", "GBP", "JPY", "CHF"]},
                    "target": {"enum": ["USD", "EUR", "GBP", "JPY", "CHF"]},
                },
                "required": ["amount", "source", "target"],
            },
        },
    },
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TOOL_PROMPTS = [
    "What's the weather in Paris?",
    "Is it cold in Helsinki today, in fahrenheit?",
    "Do I need a jacket in Berlin?",
    "How hot is it in Dubai?",
    "Email bob@example.com that the meeting moved to Monday.",
    "Tell alice@corp.org the report is ready.",
    "Send my boss a note saying I am sick.",
    "Convert 100 dollars to euros.",
    "How many yen is 50 pounds?",
    "I have 2000 Swiss francs; what is that in dollars?",
    "Hi there!",
    "What is the capital of Spain?",
    "Tell me a joke.",
    "Thanks, that is all.",
    "What is 2 + 2?",
    "Who are you?",
    "Write a haiku about rain.",
    "Remind the team by email about Friday's party.",
    "Weather in Rome and then email it to carla@mail.it",
    "Exchange 75 EUR into GBP please.",
]
NAMED = ("get_weather", "send_email", "convert_currency")
# A free-text answer from a 135M model can loop ("I'm sure you'll be fine, I'm sure ...")
# past any small token budget; bounding the answer branch keeps every case complete, so a
# failure here is the constraint's, never the budget's.
SHORT_ANSWER = {
    "type": "json_schema",
    "json_schema": {"name": "reply", "schema": {"type": "string", "maxLength": 60}},
}


def tool_case(engine: EmbeddedEngine, prompt: str, choice: Any) -> ParsedResponse:
    """Under the tool union: the text validates against the union schema, every call against
    its own tool's parameters, and every call id has the OpenAI-compatible shape."""
    request = {
        "tools": TOOLS,
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "response_format": SHORT_ANSWER,
    }
    text = planned(engine, prompt, 64, **request)
    plan = plan_chat(ChatInput(messages=chat(prompt), **request))
    assert plan.schema is not None
    jsonschema.validate(json.loads(text), plan.schema)
    parsed = plan.parse(text)
    for call in parsed.tool_calls:
        jsonschema.validate(call.arguments, PARAMETERS[call.name])
        assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    return parsed


@pytest.mark.parametrize("prompt", TOOL_PROMPTS)
def test_tool_choice_auto_validates(engine: EmbeddedEngine, prompt: str) -> None:
    parsed = tool_case(engine, prompt, "auto")
    assert parsed.kind in ("tool_calls", "parsed")


@pytest.mark.parametrize("prompt", TOOL_PROMPTS)
def test_tool_choice_required_always_calls(engine: EmbeddedEngine, prompt: str) -> None:
    parsed = tool_case(engine, prompt, "required")
    assert parsed.kind == "tool_calls" and parsed.tool_calls


@pytest.mark.parametrize("prompt", TOOL_PROMPTS)
def test_tool_choice_none_never_calls(engine: EmbeddedEngine, prompt: str) -> None:
    parsed = tool_case(engine, prompt, "none")
    assert parsed.kind == "parsed" and not parsed.tool_calls
    assert isinstance(parsed.parsed, str)


@pytest.mark.parametrize(
    ("prompt", "name"), [(p, NAMED[i % len(NAMED)]) for i, p in enumerate(TOOL_PROMPTS)]
)
def test_tool_choice_named_calls_that_tool(engine: EmbeddedEngine, prompt: str, name: str) -> None:
    choice = {"type": "function", "function": {"name": name}}
    parsed = tool_case(engine, prompt, choice)
    assert parsed.kind == "tool_calls"
    assert [c.name for c in parsed.tool_calls] == [name]
