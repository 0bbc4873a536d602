"""Small, realistic OpenAI tools arrays shared by the tool-calling tests."""

from __future__ import annotations

from typing import Any

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}

# Pydantic-style parameters: a $defs block referenced from inside, as SDK helpers emit them.
BOOKING_PARAMS = {
    "type": "object",
    "properties": {
        "guest": {"$ref": "#/$defs/Guest"},
        "nights": {"type": "integer", "minimum": 1, "maximum": 30},
    },
    "required": ["guest", "nights"],
    "$defs": {
        "Guest": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name"],
        }
    },
}


def function_tool(name: str, parameters: Any = None, description: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": description}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


TOOLS = [
    function_tool("get_weather", WEATHER_PARAMS, "Current weather for a city"),
    function_tool("book_room", BOOKING_PARAMS, "Book a hotel room"),
    function_tool("list_rooms", None, "List free rooms"),
]

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "score": {"type": "number"}},
    "required": ["summary", "score"],
}
