"""A schema's local ``$ref``s rewritten as JSON pointers from one root, so parts of it can be
copied or the whole moved and every ref still resolves: closed_schema adds open copies of ref
targets under ``$defs``, union_schema moves each tool's parameters under the union's ``$defs``.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import msgspec

from runtime.schema_walk import DATA_KEYWORDS, SCHEMA_MAPS, schema_resources


def pointer_refs(schema: dict[str, Any], base: str = "#") -> dict[str, Any]:
    """A copy of ``schema`` whose local ``$ref``s are JSON pointers from its root, after
    ``base``, and in which nothing else names a part: 2020-12 resolves ``#/...`` from the
    nearest ``$id`` (a nested one starts a resource) and ``#name`` to that resource's
    ``$anchor``; rewritten so, nested ``$id``s and ``$anchor``s are dropped (moved into the
    union, a pointer re-based by a kept ``$id`` dangled, and two tools' anchors could
    clash). The refs of ``const``/``enum``/``default`` data are values, left alone."""
    text = msgspec.json.encode(schema)
    out = msgspec.json.decode(text)  # a copy (C, a tenth of copy.deepcopy's time)
    if b'"$id"' not in text and b'"$anchor"' not in text:  # one resource, no anchors
        if base != "#":
            _prefix_refs(out, base)
        return out  # the warm path of most tools: planning runs this per request
    nodes, anchors = schema_resources(out)
    for pointer, resource, node in nodes:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            fragment = ref[1:]
            if fragment and not fragment.startswith("/"):  # an anchor
                named = anchors.get((resource, fragment))
                fragment = pointer_fragment(named[0]) if named else None
            else:
                fragment = pointer_fragment(resource) + fragment
            if fragment is not None:  # else unresolvable: validate_constraint names it
                node["$ref"] = base + fragment
        node.pop("$anchor", None)
        if pointer:
            node.pop("$id", None)
    return out


def _prefix_refs(node: Any, base: str) -> None:
    """In place: every schema object's local ``#...`` ref put after ``base``; names in
    ``properties``-like maps are walked as names, ``const``/``enum`` data left alone."""
    if isinstance(node, list):
        for item in node:
            _prefix_refs(item, base)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        node["$ref"] = base + ref[1:]
    for key, value in node.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for sub in value.values():
                _prefix_refs(sub, base)
        elif key not in DATA_KEYWORDS:
            _prefix_refs(value, base)


def pointer_fragment(pointer: str) -> str:
    """A JSON pointer written as a URI fragment (RFC 6901 section 6: percent-encoded)."""
    return urllib.parse.quote(pointer, safe="/!$&'()*+,;=:@~")


__all__ = ["pointer_fragment", "pointer_refs"]
