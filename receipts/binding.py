"""Schema binding: a receipt's manifest names a schema by hash; the schema must exist, hash to
that name, and every recorded tool call's arguments must validate against the parameters of
that tool inside it.

The bound schema of a tool-calling request is the tool union: somewhere in it (an `anyOf`
branch, possibly under an array for parallel calls or under `$defs`) each tool is an object
schema whose `properties.tool` is `{"const": NAME}` and whose `properties.arguments` is that
tool's parameters. Arguments are validated against that subschema with the union as the root,
so local `$ref`s resolve as they did when the call was generated.

Validation uses jsonschema-rs (compiled once per schema, about 60x faster per call than the
pure-Python jsonschema, which dominated offline verification), strictly offline: a `$ref`
to anything outside the bound schema is an error, never a network fetch. Every bound schema
is read as Draft 2020-12, as the gateway read it when it enforced and checked the call: its
`$schema` chooses nothing (a URL there was fetched, and one that never answered or named no
metaschema failed the chain at that receipt for good).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema_rs

from receipts.canonical import hash_json
from receipts.errors import CanonicalizationError
from receipts.lru import Lru

SchemaSource = Mapping[str, Mapping[str, Any]] | Callable[[str], Mapping[str, Any] | None]
SCHEMA_MEMO = 256  # distinct bound schemas whose verdict and validators a binding remembers


@functools.cache
def _metaschema() -> jsonschema_rs.Validator:
    """Draft 2020-12's metaschema from jsonschema-rs's own copy (runtime.schema_check's too)."""
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "https://json-schema.org/draft/2020-12/schema"}, offline=True
    )


def _as_2020_12(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema without the root's `$schema`, which validator_map_for would follow: its
    default draft is 2020-12."""
    return {key: value for key, value in schema.items() if key != "$schema"}


def tool_pointers(schema: Mapping[str, Any]) -> dict[str, str]:
    """NAME -> JSON pointer (as a URI fragment, "#/anyOf/0/properties/arguments") of the
    arguments subschema of every tool branch of a union schema (the first branch wins)."""
    found: dict[str, str] = {}
    for pointer, node in _walk(schema):
        props = node.get("properties")
        if not isinstance(props, Mapping) or "arguments" not in props:
            continue
        tool = props.get("tool")
        if not isinstance(tool, Mapping):
            continue
        names = [tool["const"]] if "const" in tool else tool.get("enum", [])
        if isinstance(names, list) and len(names) == 1 and isinstance(names[0], str):
            found.setdefault(names[0], f"{pointer}/properties/arguments")
    return found


def _walk(node: object) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every object in `node`, depth first in document order, with its RFC 6901 pointer."""
    stack: list[tuple[str, object]] = [("#", node)]
    while stack:
        pointer, item = stack.pop()
        if isinstance(item, Mapping):
            yield pointer, item
            children = [(f"{pointer}/{_escape(str(k))}", v) for k, v in item.items()]
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{pointer}/{i}", v) for i, v in enumerate(item)]))


def _escape(token: str) -> str:
    """RFC 6901 section 3: "~" is written "~0" and "/" is written "~1"."""
    return token.replace("~", "~0").replace("/", "~1")


class _Bound:
    """One bound schema's verdict: why it is unusable, or its compiled per-tool validators."""

    def __init__(self, problem: str | None, validators: dict[str, Any] | None = None) -> None:
        self.problem = problem
        self.validators = validators or {}


class SchemaBinding:
    """Checks receipts against content-addressed schemas, remembering the verdict and compiled
    per-tool validators of the SCHEMA_MEMO schemas used most recently (a chain reuses a
    handful of schemas many times; one of distinct large tool sets must not hold them all).
    A schema forgotten is looked up and compiled again when a receipt binds it."""

    def __init__(self, schemas: SchemaSource) -> None:
        self._lookup: Callable[[str], Mapping[str, Any] | None] = (
            schemas.get if isinstance(schemas, Mapping) else schemas
        )
        self._schemas: Lru[str, _Bound] = Lru(SCHEMA_MEMO)

    def problem(
        self, manifest: Mapping[str, Any], output: Mapping[str, Any], validation: Mapping[str, Any]
    ) -> str | None:
        """Why the receipt's schema binding fails, or None when it holds."""
        bound = manifest["schema_hash"]
        calls = output["tool_calls"]
        if bound is None:
            return "tool calls recorded without a bound schema" if calls else None
        schema = self._schemas.get(bound, self._load)
        if schema.problem or not validation["valid"]:
            return schema.problem  # a receipt that records an invalid output claims no conformance
        for call in calls:
            validator = schema.validators.get(call["name"])
            if validator is None:
                return f"tool {call['name']!r} is not in the bound schema {bound}"
            if not validator.is_valid(call["arguments"]):
                return (
                    f"tool call {call['id']} arguments do not validate against the bound"
                    f" schema {bound}: {first_error(validator, call['arguments'])}"
                )
        return None

    def _load(self, bound: str) -> _Bound:
        schema = self._lookup(bound)
        if schema is None:
            return _Bound(f"the bound schema {bound} is missing")
        try:
            actual = hash_json(schema)
        except CanonicalizationError as exc:
            return _Bound(f"the stored schema {bound} is not canonical JSON: {exc}")
        if actual != bound:
            return _Bound(f"the stored schema {bound} hashes to {actual} (edited)")
        try:
            _metaschema().validate(schema)
            compiled = jsonschema_rs.validator_map_for(_as_2020_12(schema), offline=True)
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
            reason = getattr(exc, "message", None) or str(exc).splitlines()[0]
            return _Bound(f"the bound schema {bound} is not a valid JSON schema: {reason}")
        validators = {}
        for name, pointer in tool_pointers(schema).items():
            validator = compiled.get(pointer)
            if validator is None:  # validator_map_for skips subschemas it cannot compile
                return _Bound(
                    f"the bound schema {bound} cannot be compiled at {pointer}"
                    " (JSON Schema patterns are ECMA-262 regular expressions)"
                )
            validators[name] = validator
        return _Bound(None, validators)


def first_error(validator: Any, instance: Any) -> str:
    """The first failure's message and JSON pointer; a value nested too deep for the
    validator's error reporting still fails, with a generic message."""
    try:
        err = next(validator.iter_errors(instance))
    except (ValueError, StopIteration):
        return "the value does not match (nested too deep to report where)"
    return f"{err.message} (at /{'/'.join(_escape(str(p)) for p in err.instance_path)})"
