"""Finding JSON-schema keywords a backend would ignore, so it can refuse the schema.

A backend that drops a keyword it does not implement enforces a weaker schema than the user
asked for; refusing lets the chain try the next backend (or the post-hoc path), which fails
closed instead of emitting output that breaks the schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runtime.errors import BackendCannotCompile
from runtime.schema_walk import resolve_ref, schema_nodes

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

# The string formats Draft 2020-12 defines: the output check (jsonschema-rs, formats asserted)
# refuses a value that breaks one, and reads any other name as an annotation (OpenAPI's
# "password", "int64"), which a backend compiling it as any string enforces in full.
CHECKED_FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "idn-email",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "iri",
        "iri-reference",
        "uri-template",
        "uuid",
        "json-pointer",
        "relative-json-pointer",
        "regex",
    }
)


def schema_keywords(schema: Any) -> Iterator[str]:
    """Every keyword used anywhere in the schema (not property names, not enum values)."""
    for _, node in schema_nodes(schema):
        yield from node


def refuse_keywords(backend: str, schema: Any, unenforced: frozenset[str]) -> None:
    found = sorted(set(schema_keywords(schema)) & unenforced)
    if found:
        raise BackendCannotCompile(f"{backend}: does not enforce {', '.join(found)}")


def overlapping_one_of(schema: Any) -> str | None:
    """The JSON pointer of the first ``oneOf`` whose branches this module cannot prove
    disjoint, or None. xgrammar, Outlines and lm-format-enforcer enforce ``oneOf`` as
    ``anyOf``: output matching two branches then breaks the schema (xgrammar says so only in a
    log line). Over branches that are disjoint the two mean the same, so those are kept:
    different JSON types, distinct ``const``/``enum`` values, or objects told apart by a
    property both require (Pydantic's discriminated unions)."""
    for pointer, node in schema_nodes(schema):
        if one_of_overlaps(schema, node):
            return f"{pointer}/oneOf"
    return None


# The string formats llguidance compiles (probed, llguidance 1.x); any other name, one Draft
# 2020-12 defines or not, is its "Unknown format" error, which refuses the whole schema.
LLGUIDANCE_FORMATS = frozenset(
    {"date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"}
)


def one_of_overlaps(root: Any, node: dict[str, Any]) -> bool:
    """Whether this node of ``root`` has a ``oneOf`` not proven disjoint (overlapping_one_of)."""
    branches = node.get("oneOf")
    return isinstance(branches, list) and not _pairwise_disjoint(root, branches)


def _pairwise_disjoint(root: Any, branches: list[Any]) -> bool:
    resolved = [_resolved(root, branch) for branch in branches]
    return all(
        _disjoint(root, a, b, _DISCRIMINATOR_DEPTH)
        for i, a in enumerate(resolved)
        for b in resolved[i + 1 :]
    )


_DISCRIMINATOR_DEPTH = 3  # how deep a discriminating property is looked for
_JSON_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string"})


def _disjoint(root: Any, a: Any, b: Any, depth: int) -> bool:
    """Whether no JSON value can match both schemas, by one of three sound rules."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a is False or b is False
    if not _types(a) & _types(b):
        return True
    values_a, values_b = _values(a), _values(b)
    if values_a is not None and values_b is not None:
        return not any(_same_json(x, y) for x in values_a for y in values_b)
    if depth == 0 or a.get("type") != "object" or b.get("type") != "object":
        return False
    shared = set(_strings(a.get("required"))) & set(_strings(b.get("required")))
    props_a, props_b = a.get("properties"), b.get("properties")
    if not isinstance(props_a, dict) or not isinstance(props_b, dict):
        return False
    return any(
        name in props_a
        and name in props_b
        and _disjoint(
            root, _resolved(root, props_a[name]), _resolved(root, props_b[name]), depth - 1
        )
        for name in shared
    )


def _types(schema: dict[str, Any]) -> frozenset[str]:
    """The JSON types a schema admits as far as ``type``, ``const`` and ``enum`` say
    ("integer" counts as "number": 3 is both)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        declared = [declared]
    types = (
        frozenset("number" if t == "integer" else t for t in declared if isinstance(t, str))
        if isinstance(declared, list)
        else _JSON_TYPES
    )
    values = _values(schema)
    if values is not None:
        types &= frozenset(_type_of(v) for v in values)
    return types


def _values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return enum if isinstance(enum, list) else None


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _same_json(x: Any, y: Any) -> bool:
    """JSON equality, where true is not 1 (Python's == says it is)."""
    return _type_of(x) == _type_of(y) and x == y


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _resolved(root: Any, schema: Any) -> Any:
    """A branch with its local ``$ref`` followed (a few hops), as Pydantic writes unions. A
    ``$ref``'s siblings only narrow what it admits, so the target alone proves disjointness."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str):
            return schema
        target = resolve_ref(root, ref)
        if target is None:
            return schema
        schema = target
    return schema
