"""Closing a schema's objects to the properties they list, for the constraint a model is held
to: left open, a small model fills arguments with invented keys. The client's schema itself is
kept as given; outputs are still validated against it.
"""

from __future__ import annotations

import copy
from collections.abc import Container, Iterable
from typing import Any

import msgspec

from runtime.errors import ConstraintTooComplex
from runtime.pointer_refs import pointer_fragment, pointer_refs
from runtime.schema_walk import (
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_SINGLES,
    pointer_token,
    resolve_ref,
)

# Keywords by which an object says how to treat keys it does not list: it keeps its rule.
_OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


# Subschemas closed_schema may read, and keys it may list, for the keys each object names in
# place (about 0.15 s): every object re-reads what it composes and lists its keys again, so
# many objects that each compose one wide allOf, or one $ref requiring thousands of keys, cost
# their product (2,000,000 keys listed, 5 s and 550 MB from 60 KB), and would be refused as
# too large only after.
MAX_IN_PLACE_READS = 50_000


def closed_schema(schema: dict[str, Any], *, param: str | None = None) -> dict[str, Any]:
    """``schema`` with every object that lists ``properties`` closed to exactly those.

    Constraints are built from this, strict or not (as OpenAI's strict mode and xgrammar's
    default do): left open, a small model fills arguments with invented keys, typically
    copied from the schema in its prompt ("type", "minLength"...). Objects that say how to
    treat other keys keep their rule, bare ``{"type": "object"}`` stays free-form, and
    ``allOf`` members stay open (closing each would make their intersection unsatisfiable).
    ``anyOf``/``oneOf`` members are closed when they are the object's whole description (a
    union of variants); under an object that lists properties or an open rule they read the
    same keys, so they stay open and the object lists the keys they name. A key that
    ``required`` names and ``properties`` does not is listed, taking any value (as the open
    object let it), or the closed object could never be valid. Anything valid against the
    result is valid against ``schema`` (but for ``oneOf``, whose exclusivity no grammar
    backend enforces anyway: outputs are validated against the tool's own schema).

    A local ``$ref`` counts as the schema it names, written where the ref is: its keys are
    listed on the object that applies it in place (a ``$ref`` beside ``properties``, in an
    ``allOf``, in the ``anyOf`` of a described object), and there it points at an open copy
    of its target (in ``$defs``, ``<name>-open``), since the target closed to its own keys
    made the composition (OpenAPI's ``allOf: [{$ref: Base}, ...]``) unsatisfiable. Refs
    used alone (a property's schema, a lone ``allOf`` member, an ``anyOf`` variant) keep
    the closed target. Refs are first made pointers from the root (:func:`pointer_refs`).

    Raises ConstraintTooComplex (naming ``param``, the schema's place in the request) past
    MAX_IN_PLACE_READS.
    """
    out = pointer_refs(schema)
    pristine = msgspec.json.decode(msgspec.json.encode(out))  # the targets open copies are made of
    open_refs: dict[str, str] = {}
    reads = 0

    def opened(ref: str) -> str:
        """The ref of an open copy of what ``ref`` names, made once (cycles end there)."""
        target = resolve_ref(pristine, ref)
        if ref in open_refs or not isinstance(target, dict):
            return open_refs.get(ref, ref)
        defs = out.setdefault("$defs", {})
        name = f"{ref.rpartition('/')[2].lstrip('#') or 'root'}-open"
        while name in defs:
            name += "-"
        open_refs[ref] = "#/$defs/" + pointer_fragment(pointer_token(name))
        defs[name] = copy.deepcopy(
            {k: v for k, v in target.items() if k not in ("$defs", "definitions")}
        )
        close(defs[name], keys_ruled=True)
        return open_refs[ref]

    def close(node: Any, *, keys_ruled: bool = False) -> None:
        """``keys_ruled``: an object this node applies to in place already rules its keys."""
        nonlocal reads
        if not isinstance(node, dict):
            return
        described = "properties" in node or any(k in node for k in _OPEN_KEYWORDS)
        if "properties" in node and not keys_ruled and not any(k in node for k in _OPEN_KEYWORDS):
            node["additionalProperties"] = False
            properties = node["properties"]
            if isinstance(properties, dict):
                keys, read = _keys_named_in_place(node, pristine)
                reads += read + len(keys)
                if reads > MAX_IN_PLACE_READS:
                    raise ConstraintTooComplex(
                        f"the schema's objects compose more than {MAX_IN_PLACE_READS:,}"
                        " subschemas and keys in place (allOf, anyOf, oneOf, then, else,"
                        " dependentSchemas and $ref beside properties, counted again for each"
                        " object that composes them); define shared properties once instead"
                        " of composing them into every object",
                        param=param,
                    )
                for key in keys:
                    properties.setdefault(key, {})
        standalone = list(_subschemas(node, skip=_IN_PLACE))  # before opened() adds to $defs
        in_place = keys_ruled or described
        conjuncts = node.get("allOf")
        conjuncts = conjuncts if isinstance(conjuncts, list) else []
        composed = [node] if in_place else []
        composed += [m for m in conjuncts if in_place or len(conjuncts) > 1]
        for part in composed:
            if isinstance(part, dict) and isinstance(part.get("$ref"), str):
                part["$ref"] = opened(part["$ref"])
        for sub in standalone:
            close(sub)
        for member in _in_place_members(node):
            close(member, keys_ruled=in_place)

    close(out)
    return out


# Subschemas that read the same object as the node holding them. Inside ``not`` and ``if``
# closing would widen what the whole accepts (the negation of a narrower schema), so nothing
# there is touched; ``allOf`` members stay open (see closed_schema).
_IN_PLACE = frozenset({"anyOf", "oneOf", "allOf", "not", "if", "then", "else", "dependentSchemas"})


def _in_place_members(node: dict[str, Any]) -> Iterable[Any]:
    """The subschemas closed_schema closes as parts of ``node``'s own object."""
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        yield from members if isinstance(members, list) else ()
    yield from (node[key] for key in ("then", "else") if isinstance(node.get(key), dict))
    dependent = node.get("dependentSchemas")
    yield from dependent.values() if isinstance(dependent, dict) else ()


def _keys_named_in_place(node: dict[str, Any], root: dict[str, Any]) -> tuple[list[str], int]:
    """Keys ``node`` requires, and those its in-place parts (``allOf``, ``anyOf``, ``oneOf``,
    ``then``, ``else``, ``dependentSchemas``, the target of its ``$ref`` in ``root``: they
    read the same object) list or require, at any depth; in the schema's order, so the closed
    schema's text is stable. With the number of subschemas read: each once, however many
    refs name it (read once per path, refs that each name the next level twice took 2^depth
    steps, and a 2 KB schema held the event loop for minutes)."""
    keys: list[str] = []
    read: set[int] = set()  # ids of the subschemas read

    def read_part(part: dict[str, Any]) -> None:
        read.add(id(part))
        required = part.get("required")
        if isinstance(required, list):
            keys.extend(k for k in required if isinstance(k, str))
        ref = part.get("$ref")
        conjuncts = part.get("allOf")
        for sub in (
            resolve_ref(root, ref) if isinstance(ref, str) else None,
            *(conjuncts if isinstance(conjuncts, list) else ()),
            *_in_place_members(part),
        ):
            if isinstance(sub, dict) and id(sub) not in read:
                listed = sub.get("properties")
                keys.extend(listed if isinstance(listed, dict) else ())
                read_part(sub)

    read_part(node)
    return keys, len(read)


def _subschemas(node: dict[str, Any], skip: Container[str] = ()) -> Iterable[Any]:
    for key in SCHEMA_MAPS:
        sub = node.get(key)
        if isinstance(sub, dict) and key not in skip:
            yield from sub.values()
    for key in SCHEMA_LISTS:
        sub = node.get(key)
        if isinstance(sub, list) and key not in skip:
            yield from sub
    for key in SCHEMA_SINGLES:
        sub = node.get(key)
        if isinstance(sub, dict) and key not in skip:
            yield sub


__all__ = ["MAX_IN_PLACE_READS", "closed_schema"]
