"""Finding JSON-schema keywords a backend would ignore, so it can refuse the schema.

A backend that drops a keyword it does not implement enforces a weaker schema than the user
asked for; refusing lets the chain try the next backend (or the post-hoc path), which fails
closed instead of emitting output that breaks the schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runtime.errors import BackendCannotCompile

# Not enforced by xgrammar, Outlines nor lm-format-enforcer (each accepts and ignores them;
# measured by tests/runtime/test_backends.py::test_compiled_schema_keywords_are_enforced).
IGNORED_BY_ALL_BUT_LLGUIDANCE = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "dependentRequired",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "propertyNames",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)

# Numeric and object-size bounds: Outlines and lm-format-enforcer accept and ignore them
# (vLLM's outlines path was seen ignoring minimum/maximum too).
BOUNDS = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minProperties",
        "maxProperties",
    }
)

# Keywords whose value is a map of name -> subschema (the names are not keywords).
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


# Keywords whose value is data: instances, or property names (dependentRequired's keys).
_DATA = frozenset({"enum", "const", "default", "examples", "dependentRequired"})


def schema_keywords(schema: Any) -> Iterator[str]:
    """Every keyword used anywhere in the schema (not property names, not enum values)."""
    if isinstance(schema, list):
        for item in schema:
            yield from schema_keywords(item)
        return
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        yield key
        if key in _DATA:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for sub in value.values():
                yield from schema_keywords(sub)
        else:
            yield from schema_keywords(value)


def refuse_keywords(backend: str, schema: Any, unenforced: frozenset[str]) -> None:
    found = sorted(set(schema_keywords(schema)) & unenforced)
    if found:
        raise BackendCannotCompile(f"{backend}: does not enforce {', '.join(found)}")
