"""RFC 8785 (JCS) canonical JSON and the SHA-256 helpers every hash in a receipt is built from.

One canonical byte string per JSON value is what makes a hash reproducible by an auditor in any
language; the `rfc8785` package is the reference implementation used here.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from receipts.errors import CanonicalizationError


def canonical_json(obj: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of a JSON value (dict keys must be strings).

    Raises CanonicalizationError for values JCS cannot represent exactly: NaN, infinities,
    integers outside +-(2**53 - 1), lone surrogates and non-JSON types.
    """
    try:
        return rfc8785.dumps(obj)
    except rfc8785.CanonicalizationError as exc:
        raise CanonicalizationError(f"value has no RFC 8785 canonical form: {exc}") from exc


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256 of raw bytes."""
    return hashlib.sha256(data).hexdigest()


def hash_json(obj: Any) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of `obj` (schema, manifest, entry hashes)."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()
