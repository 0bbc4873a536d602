"""The manifest: what produced an output (schema, model, weights, tokenizer, engine, backend,
renderer, sampling), hashed so a receipt binds all of it with one 64-hex value.

Schemas are content addressed: `schema_hash(schema)` is the key they are stored under, and the
manifest's `schema_hash` is what binds a receipt to the exact schema its calls were held to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from receipts.canonical import canonical_json, hash_json
from receipts.errors import ReceiptFormatError

HEX64 = re.compile(r"[0-9a-f]{64}")

# JSON-schema and tool-union constraints bind a schema; regex and EBNF bind the constraint text.
SCHEMA_KINDS = frozenset({"json", "tools"})
TEXT_KINDS = frozenset({"regex", "ebnf"})
CONSTRAINT_KINDS = SCHEMA_KINDS | TEXT_KINDS | {"none"}

MANIFEST_FIELDS = (
    "schema_hash",
    "model",
    "weights_digest",
    "tokenizer_digest",
    "engine",
    "backend",
    "renderer",
    "sampling",
    "constraint_kind",
    "constraint_sha256",
)


def is_hex64(value: object) -> bool:
    """True for a lowercase 64-hex string (every SHA-256 in the format)."""
    return isinstance(value, str) and HEX64.fullmatch(value) is not None


def build_manifest(
    *,
    schema_hash: str | None,
    model: str,
    weights_digest: str | None,
    tokenizer_digest: str | None,
    engine: str,
    backend: str | None,
    renderer: str | None,
    sampling: Mapping[str, Any],
    constraint_kind: str,
    constraint_sha256: str | None = None,
) -> dict[str, Any]:
    """A validated manifest dict (every field present, in MANIFEST_FIELDS order).

    Digests may be None when an engine cannot report them (a remote vLLM without a configured
    weights digest): the receipt then records honestly that they are unknown.
    """
    manifest = {
        "schema_hash": schema_hash,
        "model": model,
        "weights_digest": weights_digest,
        "tokenizer_digest": tokenizer_digest,
        "engine": engine,
        "backend": backend,
        "renderer": renderer,
        "sampling": dict(sampling),
        "constraint_kind": constraint_kind,
        "constraint_sha256": constraint_sha256,
    }
    check_manifest(manifest)
    canonical_json(manifest["sampling"])  # CanonicalizationError now, not at sealing time
    return manifest


def check_manifest(manifest: object) -> None:
    """Raise ReceiptFormatError unless `manifest` has exactly the v1 manifest shape."""
    if not isinstance(manifest, dict):
        raise ReceiptFormatError("manifest must be an object")
    if set(manifest) != set(MANIFEST_FIELDS):
        missing = sorted(set(MANIFEST_FIELDS) - set(manifest))
        extra = sorted(set(manifest) - set(MANIFEST_FIELDS))
        raise ReceiptFormatError(f"manifest fields: missing {missing}, unexpected {extra}")
    for name in ("model", "engine"):
        if not isinstance(manifest[name], str) or not manifest[name]:
            raise ReceiptFormatError(f"manifest.{name} must be a non-empty string")
    for name in ("weights_digest", "tokenizer_digest", "backend", "renderer"):
        if manifest[name] is not None and not isinstance(manifest[name], str):
            raise ReceiptFormatError(f"manifest.{name} must be a string or null")
    if not isinstance(manifest["sampling"], dict):
        raise ReceiptFormatError("manifest.sampling must be an object")
    kind = manifest["constraint_kind"]
    if kind not in CONSTRAINT_KINDS:
        raise ReceiptFormatError(
            f"manifest.constraint_kind must be one of {sorted(CONSTRAINT_KINDS)}, got {kind!r}"
        )
    _check_binding(kind, manifest["schema_hash"], manifest["constraint_sha256"])


def _check_binding(kind: str, schema_hash: object, constraint_sha256: object) -> None:
    """Exactly the hash the constraint kind calls for is set: one binding, never two."""
    wants_schema = kind in SCHEMA_KINDS
    wants_text = kind in TEXT_KINDS
    if wants_schema != (schema_hash is not None) or (wants_schema and not is_hex64(schema_hash)):
        raise ReceiptFormatError(
            f"manifest.schema_hash must be 64 lowercase hex for constraint_kind {kind!r}"
            if wants_schema
            else f"manifest.schema_hash must be null for constraint_kind {kind!r}"
        )
    if wants_text != (constraint_sha256 is not None) or (
        wants_text and not is_hex64(constraint_sha256)
    ):
        raise ReceiptFormatError(
            f"manifest.constraint_sha256 must be 64 lowercase hex for constraint_kind {kind!r}"
            if wants_text
            else f"manifest.constraint_sha256 must be null for constraint_kind {kind!r}"
        )


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """hex(SHA-256(JCS(manifest)))."""
    return hash_json(manifest)


def schema_hash(schema: Mapping[str, Any]) -> str:
    """hex(SHA-256(JCS(schema))): the content address a schema is stored under."""
    if not isinstance(schema, Mapping):
        raise ReceiptFormatError("a schema must be a JSON object")
    return hash_json(schema)
