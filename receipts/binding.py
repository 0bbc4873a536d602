"""Schema binding: a receipt's manifest names a schema by hash; the schema must exist, hash to
that name, and every recorded tool call's arguments must validate against the parameters of
that tool inside it.

The bound schema of a tool-calling request is the tool union: somewhere in it (a `oneOf`
branch, possibly under an array for parallel calls or under `$defs`) each tool is an object
schema whose `properties.tool` is `{"const": NAME}` and whose `properties.arguments` is that
tool's parameters. Arguments are validated against that subschema with the union as the root,
so local `$ref`s resolve as they did when the call was generated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match
from referencing.exceptions import Unresolvable

from receipts.canonical import hash_json
from receipts.errors import CanonicalizationError

SchemaSource = Mapping[str, Mapping[str, Any]] | Callable[[str], Mapping[str, Any] | None]


def tool_parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """NAME -> arguments subschema for every tool branch of a union schema (first wins)."""
    found: dict[str, Any] = {}
    for node in _walk(schema):
        props = node.get("properties")
        if not isinstance(props, Mapping) or "arguments" not in props:
            continue
        tool = props.get("tool")
        if not isinstance(tool, Mapping):
            continue
        names = [tool["const"]] if "const" in tool else tool.get("enum", [])
        if isinstance(names, list) and len(names) == 1 and isinstance(names[0], str):
            found.setdefault(names[0], props["arguments"])
    return found


def _walk(node: object) -> Iterator[Mapping[str, Any]]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


class SchemaBinding:
    """Checks receipts against content-addressed schemas, caching each schema's verdict and
    compiled per-tool validators (a chain reuses a handful of schemas many times)."""

    def __init__(self, schemas: SchemaSource) -> None:
        self._lookup: Callable[[str], Mapping[str, Any] | None] = (
            schemas.get if isinstance(schemas, Mapping) else schemas
        )
        self._schemas: dict[str, tuple[str | None, Any, dict[str, Any]]] = {}
        self._validators: dict[tuple[str, str], Any] = {}

    def problem(
        self, manifest: Mapping[str, Any], output: Mapping[str, Any], validation: Mapping[str, Any]
    ) -> str | None:
        """Why the receipt's schema binding fails, or None when it holds."""
        bound = manifest["schema_hash"]
        calls = output["tool_calls"]
        if bound is None:
            return "tool calls recorded without a bound schema" if calls else None
        reason, _, _ = self._schema(bound)
        if reason or not validation["valid"]:
            return reason  # a receipt that records an invalid output claims no conformance
        for call in calls:
            validator = self._validator(bound, call["name"])
            if validator is None:
                return f"tool {call['name']!r} is not in the bound schema {bound}"
            try:
                valid = validator.is_valid(call["arguments"])
            except Unresolvable as exc:  # a $ref the bound schema cannot resolve
                return f"the bound schema {bound} has an unresolvable $ref: {exc}"
            if not valid:
                err = best_match(validator.iter_errors(call["arguments"]))
                where = "/" + "/".join(str(p) for p in err.absolute_path)
                return (
                    f"tool call {call['id']} arguments do not validate against the bound"
                    f" schema {bound}: {err.message} (at {where})"
                )
        return None

    def _schema(self, bound: str) -> tuple[str | None, Any, dict[str, Any]]:
        if bound not in self._schemas:
            self._schemas[bound] = self._load(bound)
        return self._schemas[bound]

    def _load(self, bound: str) -> tuple[str | None, Any, dict[str, Any]]:
        schema = self._lookup(bound)
        if schema is None:
            return f"the bound schema {bound} is missing", None, {}
        try:
            actual = hash_json(schema)
        except CanonicalizationError as exc:
            return f"the stored schema {bound} is not canonical JSON: {exc}", None, {}
        if actual != bound:
            return f"the stored schema {bound} hashes to {actual} (edited)", None, {}
        try:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            return f"the bound schema {bound} is not a valid JSON schema: {exc.message}", None, {}
        return None, cls(schema), tool_parameters(schema)

    def _validator(self, bound: str, name: str) -> Any:
        key = (bound, name)
        if key not in self._validators:
            _, root, tools = self._schema(bound)
            self._validators[key] = root.evolve(schema=tools[name]) if name in tools else None
        return self._validators[key]
