"""Realistic, distinct tool sets for the grammar benchmarks.

Agents declare a handful of tools like these: weather, calendar, database query, email,
flights, payments, with enums, nested objects, arrays, patterns and numeric bounds. Each set
draws 2-5 families and varies bounds, enum members and optional fields by seed, so every set
is a new schema to the grammar compiler (a cold compile).
"""

from __future__ import annotations

import random
from typing import Any


def _weather(rng: random.Random) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": rng.choice([40, 60, 80])},
            "unit": {"enum": rng.sample(["celsius", "fahrenheit", "kelvin"], rng.randint(2, 3))},
            "days": {"type": "integer", "minimum": 1, "maximum": rng.randint(5, 16)},
        },
        "required": ["city"],
    }


def _calendar(rng: random.Random) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 120},
            "start": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$"},
            "duration_minutes": {
                "type": "integer",
                "minimum": 5,
                "maximum": rng.choice([240, 480]),
            },
            "attendees": {
                "type": "array",
                "items": {"type": "string", "format": "email"},
                "maxItems": rng.randint(5, 20),
            },
            "reminder": {
                "type": "object",
                "properties": {
                    "minutes_before": {"type": "integer", "minimum": 0},
                    "channel": {"enum": ["email", "push", "sms"]},
                },
                "required": ["minutes_before"],
            },
        },
        "required": ["title", "start"],
    }


def _db_query(rng: random.Random) -> dict[str, Any]:
    tables = rng.sample(["users", "orders", "invoices", "products", "events", "sessions"], 3)
    return {
        "type": "object",
        "properties": {
            "table": {"enum": tables},
            "columns": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[a-z_]+$"},
                "minItems": 1,
            },
            "filters": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "column": {"type": "string"},
                        "op": {"enum": ["=", "!=", "<", ">", "like"]},
                        "value": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                    },
                    "required": ["column", "op", "value"],
                },
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": rng.choice([100, 500, 1000])},
        },
        "required": ["table"],
    }


def _email(rng: random.Random) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "to": {"type": "array", "items": {"type": "string", "format": "email"}, "minItems": 1},
            "subject": {"type": "string", "maxLength": rng.choice([78, 120, 200])},
            "body": {"type": "string"},
            "priority": {"enum": ["low", "normal", "high"]},
        },
        "required": ["to", "subject", "body"],
    }


def _flights(rng: random.Random) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": {"type": "string", "format": "date"},
            "passengers": {"type": "integer", "minimum": 1, "maximum": rng.randint(6, 9)},
            "cabin": {"enum": rng.sample(["economy", "premium", "business", "first"], 3)},
        },
        "required": ["origin", "destination", "date"],
    }


def _payment(rng: random.Random) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "minimum": 0.01, "maximum": rng.choice([1e4, 1e5])},
            "currency": {"enum": rng.sample(["EUR", "USD", "GBP", "JPY", "CHF"], 3)},
            "recipient": {
                "type": "object",
                "properties": {
                    "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$"},
                    "name": {"type": "string"},
                },
                "required": ["iban", "name"],
            },
        },
        "required": ["amount", "currency", "recipient"],
    }


FAMILIES = {
    "get_weather": _weather,
    "create_event": _calendar,
    "query_db": _db_query,
    "send_email": _email,
    "search_flights": _flights,
    "make_payment": _payment,
}


def tool_set(seed: int) -> list[dict[str, Any]]:
    """One OpenAI ``tools`` array, distinct for every seed."""
    rng = random.Random(seed)
    names = rng.sample(sorted(FAMILIES), rng.randint(2, 5))
    return [
        {
            "type": "function",
            "function": {
                "name": f"{name}_v{seed}",
                "description": f"{name} tool",
                "parameters": FAMILIES[name](rng),
            },
        }
        for name in names
    ]


def union_of(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The tool-union schema the gateway would constrain to (tool_choice auto)."""
    from runtime.tools import parse_tools_field
    from runtime.union_schema import union_schema

    return union_schema(parse_tools_field(tools), tool_choice="auto")


def union_for(seed: int) -> dict[str, Any]:
    return union_of(tool_set(seed))
