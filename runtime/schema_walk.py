"""Walking a JSON schema: its subschemas with their JSON pointers, local ``$ref`` targets,
the resources and anchors Draft 2020-12 resolves against, its nesting depth and its regexes.
Shared by the limits, the schema checks, tool unions and the backends, which all read a
schema the same way.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")  # an array index in a JSON pointer (RFC 6901)


def resolve_ref(schema: Any, ref: str) -> Any:
    """The container a local JSON-pointer ``$ref`` (``#``, ``#/$defs/x``) names, or None."""
    node = schema
    if ref in ("#", "#/"):
        return node
    if not ref.startswith("#/"):
        return None  # an anchor: not followed
    for part in urllib.parse.unquote(ref[2:]).split("/"):  # a URI fragment (RFC 6901 s6)
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and _INDEX.fullmatch(key) and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node if isinstance(node, dict | list) else None


# Keywords whose value is a map of name -> subschema (the names are not keywords).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


# Keywords whose value is a list of subschemas, and those whose value is one subschema.
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_SINGLES = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)


# Keywords whose value is data: instances, or property names (dependentRequired's keys).
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "dependentRequired"})


def schema_nodes(schema: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object in the schema that is a (sub)schema, with its JSON pointer: not enum
    values, not the maps of names (``properties``, ``$defs``) that hold subschemas."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        pointer, node = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{pointer}/{i}", item) for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        yield pointer, node
        for key, value in node.items():
            at = f"{pointer}/{pointer_token(key)}"
            if key in DATA_KEYWORDS:
                continue
            if key in SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((f"{at}/{pointer_token(name)}", sub) for name, sub in value.items())
            else:
                stack.append((at, value))


def integer_typed(node: dict[str, Any]) -> bool:
    """Whether the schema node's ``type`` admits integers and no other numbers."""
    types = node.get("type")
    return types == "integer" or (
        isinstance(types, list) and "integer" in types and "number" not in types
    )


def schema_resources(
    schema: Any,
) -> tuple[list[tuple[str, str, dict[str, Any]]], dict[tuple[str, str], list[str]]]:
    """What Draft 2020-12 resolves a local ``$ref`` against: each schema object as (pointer,
    pointer of its resource, object), where the resource is the nearest object at or above
    it holding ``$id`` (the root otherwise) and ``#/...`` is a pointer from there; and the
    pointers holding each ``$anchor`` of each resource, which ``#name`` names."""
    nodes = list(schema_nodes(schema))
    roots = {pointer for pointer, node in nodes if "$id" in node} | {""}
    placed, anchors = [], {}
    for pointer, node in nodes:
        resource = pointer
        while resource not in roots:
            resource = resource.rpartition("/")[0]
        placed.append((pointer, resource, node))
        if isinstance(node.get("$anchor"), str):
            anchors.setdefault((resource, node["$anchor"]), []).append(pointer)
    return placed, anchors


def pointer_token(key: str) -> str:
    """``key`` as a JSON pointer reference token (RFC 6901: "~" is "~0", "/" is "~1")."""
    return key.replace("~", "~0").replace("/", "~1")


def schema_patterns(schema: Any) -> list[str]:
    """Every regex in a schema (``pattern`` values, ``patternProperties`` keys): the same
    compilers build automata from them as from a ``regex`` constraint."""
    found, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                found.extend(node["patternProperties"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def schema_depth(schema: Any) -> int:
    """Nesting depth of a JSON schema with its local ``$ref``s followed (a target counts as a
    level below its $ref): a chain of ``$defs`` nests as deep as the schema written out, and
    the compilers recurse through it (1,500 linked $defs crash llguidance). A cycle (a
    recursive schema) is cut where it comes back to a node being measured, and every node
    is measured once however many pointers name it. Iterative: a deep schema must not blow
    this stack either."""
    done: dict[int, int] = {}  # id of a container -> its depth
    on_path: set[int] = {id(schema)}
    # frames: the node, its children left (containers, then its $ref), the deepest so far
    stack: list[list[Any]] = [[schema, _below(schema), 0]]
    depth = 0
    while stack:
        frame = stack[-1]
        for child in frame[1]:
            node = resolve_ref(schema, child) if isinstance(child, str) else child
            if node is None or id(node) in on_path:
                continue
            if id(node) in done:
                frame[2] = max(frame[2], done[id(node)])
                continue
            on_path.add(id(node))
            stack.append([node, _below(node), 0])
            break
        else:
            stack.pop()
            depth = frame[2] + 1
            on_path.discard(id(frame[0]))
            done[id(frame[0])] = depth
            if stack:
                stack[-1][2] = max(stack[-1][2], depth)
    return depth


def _below(node: Any) -> Iterator[Any]:
    """A JSON value's containers, then its local $ref (as the string) when it has one."""
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    yield from (v for v in values if isinstance(v, dict | list))
    if isinstance(node, dict) and isinstance(ref := node.get("$ref"), str) and ref.startswith("#"):
        yield ref


__all__ = [
    "DATA_KEYWORDS",
    "SCHEMA_LISTS",
    "SCHEMA_MAPS",
    "SCHEMA_SINGLES",
    "integer_typed",
    "pointer_token",
    "resolve_ref",
    "schema_depth",
    "schema_nodes",
    "schema_patterns",
    "schema_resources",
]
