"""Checking schemas and validating values against them.

:func:`check_schema` decides whether a client's schema (a tool's parameters, a response
format) is one this gateway can enforce and a receipt can bind: within the size limits, valid
Draft 2020-12, local ``$ref`` only, exact numbers. :func:`validate` checks a value (model
output) against a schema and raises StructuredOutputInvalid at the first failing pointer.

Agents send the same tools with every request, and a metaschema check costs milliseconds:
both caches are keyed by canonical schema text, so each distinct schema is checked and built
once per process. Failures raise and are never cached. Outputs are validated with
jsonschema-rs, the validator receipts/binding.py verifies receipts with, so the verdict a
receipt records and an auditor's re-check come from the same implementation (and it is 50x
faster than jsonschema per value); the metaschema check keeps jsonschema's messages.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

import jsonschema
import jsonschema_rs
import msgspec

from runtime.bounded_cache import size_bounded
from runtime.constraint import json_text
from runtime.errors import (
    BackendCannotCompile,
    ConstraintTooComplex,
    InvalidSchema,
    StructuredOutputInvalid,
)
from runtime.exact_json import InexactNumber, load_exact
from runtime.limits import DEFAULT_LIMITS, Limits, check_schema_bounds
from runtime.regex_features import misread_construct, regex_problem
from runtime.schema_walk import pointer_token, resolve_ref, schema_patterns, schema_resources


def check_schema(schema: Any, param: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Reject a schema over the size or depth limit, that is not valid Draft 2020-12, or that
    points outside itself. The limits come first: the metaschema check is slow on large
    schemas and its cache keeps what it checked.

    Remote ``$ref`` would make validation fetch URLs (and backends cannot compile them).
    """
    if not isinstance(schema, dict):
        raise InvalidSchema(f"'{param}' must be a JSON schema object", param=param)
    try:
        canonical = canonical_text(schema)  # the key of both caches below
    except (TypeError, ValueError) as exc:  # a Python caller's non-JSON value
        raise InvalidSchema(f"'{param}' is not JSON: {exc}", param=param) from None
    check_schema_bounds(canonical, limits, param)
    try:
        check_metaschema(canonical)
    except RecursionError:  # jsonschema recurses per level: ~100 levels of properties do it
        raise ConstraintTooComplex(
            f"'{param}' nests too deep to check; keep it within max_schema_depth", param=param
        ) from None
    except InexactNumber as exc:  # the manifest binds the schema in RFC 8785 canonical form
        raise InvalidSchema(
            f"'{param}' holds a number a receipt cannot record exactly ({exc})", param=param
        ) from None
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidSchema(
            f"'{param}' is not a valid JSON schema at {where}: {exc.message}", param=param
        ) from None
    _check_identifiers(schema, param)
    for pattern in schema_patterns(schema):
        construct = misread_construct(pattern)
        if construct is not None:  # the post-hoc path would decode it free: refuse it here
            raise BackendCannotCompile(
                f"'{param}' has the pattern {pattern[:80]!r}, which uses {construct}: no"
                " grammar backend enforces it as the output check reads it; rewrite it"
                " without",
                param=param,
            )
    for ref in refs_in(schema):
        if not ref.startswith("#"):
            raise InvalidSchema(
                f"'{param}' uses $ref {ref!r}: only local references ('#...') are supported",
                param=param,
            )
        if _loops(schema, ref):
            raise InvalidSchema(
                f"'{param}' has $ref {ref!r} leading back to itself through $refs alone: it"
                " stands for no schema (give the loop a schema with content)",
                param=param,
            )
    check_compiles(canonical, param)


def check_compiles(canonical: bytes, param: str, what: str | None = None) -> None:
    """Build (and keep) the validator the output will be checked with, so a schema it cannot
    build (a ``$ref`` that does not resolve, a pattern it cannot read) is a 400 before
    anything is generated, never a 500 after. ``canonical``: the schema as
    :func:`canonical_text` writes it; ``what`` names it in errors (default: ``param``)."""
    try:
        _validator(canonical)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        reason = getattr(exc, "message", None) or str(exc).splitlines()[0]
        what = what or f"'{param}'"
        raise InvalidSchema(f"{what} cannot be compiled: {reason}", param=param) from None


def _check_identifiers(schema: dict[str, Any], param: str) -> None:
    """Refuse what the tool union cannot carry over as a static pointer
    (runtime/pointer_refs.py rewrites ``$anchor`` refs and those inside a nested ``$id`` as
    pointers from its root): ``$dynamicRef`` resolves by the path taken at validation time
    (and xgrammar ignored it), and an ``$anchor`` defined twice in one resource, which
    2020-12 forbids, names either."""
    nodes, anchors = schema_resources(schema)
    for pointer, _, node in nodes:
        for keyword in ("$dynamicRef", "$dynamicAnchor"):
            if keyword in node:
                raise InvalidSchema(
                    f"'{param}' uses {keyword} at {pointer or '(root)'}: dynamic references"
                    ' are not supported; use $ref with a JSON pointer ("#/$defs/...") or an'
                    " $anchor",
                    param=param,
                )
    for (_, name), where in anchors.items():
        if len(where) > 1:
            raise InvalidSchema(
                f"'{param}' defines $anchor {name!r} at {where[0]} and at {where[1]}, in one"
                f" schema resource: $ref '#{name}' could mean either (rename one)",
                param=param,
            )


# Keywords that do not constrain the value: a node holding only these besides a $ref (or a
# one-member allOf of one) stands for its target alone.
_NOT_CONSTRAINING = frozenset(
    {
        "title", "description", "$comment", "examples", "default", "deprecated",
        "readOnly", "writeOnly", "$anchor", "$id", "$schema", "$defs", "definitions",
    }
)  # fmt: skip


def _loops(schema: dict[str, Any], ref: str) -> bool:
    """Whether following ``ref`` through nodes that stand for their target alone comes back
    to a ref already followed: a loop with no schema in it, which compilers turn into an
    empty token mask mid-output (a 500) or a crash of the vLLM server's request."""
    followed: set[str] = set()
    while ref not in followed:
        followed.add(ref)
        target = _alias_of(resolve_ref(schema, ref))
        if target is None:
            return False
        ref = target
    return True


def _alias_of(node: Any) -> str | None:
    """The $ref a node stands for alone (beside keywords that do not constrain, or as the one
    member of an allOf), or None."""
    if not isinstance(node, dict):
        return None
    rest = node.keys() - _NOT_CONSTRAINING
    if rest == {"$ref"}:
        return node["$ref"] if isinstance(node["$ref"], str) else None
    if rest == {"allOf"} and isinstance(node["allOf"], list) and len(node["allOf"]) == 1:
        member = node["allOf"][0]
        if isinstance(member, dict) and member.keys() - _NOT_CONSTRAINING == {"$ref"}:
            return member["$ref"] if isinstance(member["$ref"], str) else None
    return None


def refs_in(node: Any) -> Iterable[str]:
    """Every ``$ref`` string in ``node``, at any depth."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from refs_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs_in(value)


_sorted_json = msgspec.json.Encoder(order="sorted").encode


def canonical_text(schema: dict[str, Any]) -> bytes:
    """The text both caches here key on: compact JSON, keys sorted."""
    return json_text(schema, _sorted_json)


@size_bounded(len, max_entries=4096, max_bytes=16 << 20)
def check_metaschema(canonical: bytes) -> None:
    """jsonschema-rs decides (1 ms for a 60 KB schema where python-jsonschema took 0.76 s,
    on the event loop); python-jsonschema runs only on a schema it refuses, for the message
    naming where. Always Draft 2020-12's metaschema, from jsonschema-rs's own copy: the
    schema's ``$schema`` must not choose it (that made it fetch any URL or file)."""
    schema = load_exact(canonical)
    if not _metaschema().is_valid(schema):
        jsonschema.Draft202012Validator.check_schema(schema)
    for pattern in schema_patterns(schema):  # the limits read patterns with Python's parser
        problem = regex_problem(pattern)
        if problem is not None:
            raise jsonschema.SchemaError(f"the pattern {pattern!r} {problem}")


@functools.cache
def _metaschema() -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "https://json-schema.org/draft/2020-12/schema"}, offline=True
    )


# A validator holds about six times its schema's text (400 KB for a 63 KB tool union).
@size_bounded(len, max_entries=1024, max_bytes=8 << 20)
def _validator(canonical: bytes) -> jsonschema_rs.Validator:
    """Formats are asserted, not only annotated (2020-12's default): the decoders enforce a
    format's shape, not its meaning (llguidance writes 2023-02-29, xgrammar 2023-02-31), and
    a 200 must hold a value the schema admits."""
    return jsonschema_rs.Draft202012Validator(
        json.loads(canonical), offline=True, validate_formats=True
    )


def validate(value: Any, schema: dict[str, Any], raw: str, *, param: str, prefix: str = "") -> None:
    """Raise StructuredOutputInvalid at the JSON pointer of the first failure, naming
    ``param``, the request field whose schema the value fails."""
    validator = _validator(canonical_text(schema))
    if validator.is_valid(value):
        return
    try:
        error = next(validator.iter_errors(value))
        path, message = error.instance_path, _failure(error)
    except (ValueError, StopIteration):  # nested too deep for jsonschema-rs to report where
        path, message = [], "the value does not match (nested too deep to report where)"
    pointer = prefix + "".join("/" + pointer_token(str(p)) for p in path)
    raise StructuredOutputInvalid(
        f"output fails its schema at {repr(pointer) if pointer else 'the root'}: {message}",
        schema=schema,
        raw_output=raw,
        pointer=pointer,
        param=param,
    )


# Failures whose jsonschema-rs message names properties, not the failing value
_NAMING_PROPERTIES = frozenset({"required", "additionalProperties", "unevaluatedProperties"})


def _failure(error: jsonschema_rs.ValidationError) -> str:
    """jsonschema-rs's words for a failure, which mostly quote the failing value whole: kept
    for a scalar, or when they name properties only; for another object or array (under
    tools, whole tool calls that no receipt records, in a 422) the schema keyword it breaks
    and where the schema has it instead."""
    if not isinstance(error.instance, dict | list) or error.kind.name in _NAMING_PROPERTIES:
        return str(error.message)
    at = "".join("/" + pointer_token(str(p)) for p in error.schema_path)
    keyword = str(error.schema_path[-1]) if error.schema_path else "schema"
    what = "object" if isinstance(error.instance, dict) else "array"
    return f"the {what} breaks the schema's {keyword!r} (at {at!r} in the schema)"


__all__ = [
    "canonical_text",
    "check_compiles",
    "check_metaschema",
    "check_schema",
    "refs_in",
    "validate",
]
