"""Signed checkpoints: a chain's Merkle root at a tree size, signed, so a verifier can detect
a truncated tail or a rewritten history against a root it saved earlier.

{"v": 1, "chain", "tree_size", "root_hash", "timestamp", "key_id", "signature"}; the signature
is base64 Ed25519 over JCS of the checkpoint without "signature".
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime
from typing import TypedDict

from receipts.canonical import canonical_json
from receipts.errors import ReceiptFormatError
from receipts.manifest import is_hex64
from receipts.record import KEY_ID
from receipts.signing import KeyRing, Signer, decode_signature
from receipts.times import format_timestamp, is_timestamp, utc_now


class Checkpoint(TypedDict):
    """A signed checkpoint as JSON (docs/receipt-format.md section 7)."""

    v: int
    chain: str
    tree_size: int
    root_hash: str
    timestamp: str
    key_id: str
    signature: str


CHECKPOINT_FIELDS: tuple[str, ...] = tuple(Checkpoint.__annotations__)


def make_checkpoint(
    chain: str,
    tree_size: int,
    root_hash: str,
    signer: Signer,
    timestamp: datetime | str | None = None,
) -> Checkpoint:
    """Sign the root (hex) of `chain`'s tree at `tree_size`; timestamp defaults to now."""
    stamp = (
        utc_now()
        if timestamp is None
        else timestamp
        if isinstance(timestamp, str)
        else format_timestamp(timestamp)
    )
    unsigned = {
        "v": 1,
        "chain": chain,
        "tree_size": tree_size,
        "root_hash": root_hash,
        "timestamp": stamp,
        "key_id": signer.key_id,
    }
    check_checkpoint({**unsigned, "signature": ""})
    signature = signer.sign(canonical_json(unsigned))
    return Checkpoint(**unsigned, signature=base64.b64encode(signature).decode("ascii"))


def check_checkpoint(cp: object) -> None:
    """Raise ReceiptFormatError unless `cp` has the v1 checkpoint shape."""
    if not isinstance(cp, Mapping) or set(cp) != set(CHECKPOINT_FIELDS):
        raise ReceiptFormatError(f"a checkpoint is an object with fields {list(CHECKPOINT_FIELDS)}")
    if cp["v"] != 1 or type(cp["v"]) is not int:
        raise ReceiptFormatError("checkpoint.v must be 1")
    if not isinstance(cp["chain"], str) or not cp["chain"]:
        raise ReceiptFormatError("checkpoint.chain must be a non-empty string")
    if type(cp["tree_size"]) is not int or cp["tree_size"] < 0:
        raise ReceiptFormatError("checkpoint.tree_size must be a non-negative integer")
    if not is_hex64(cp["root_hash"]):
        raise ReceiptFormatError("checkpoint.root_hash must be 64 lowercase hex")
    if not is_timestamp(cp["timestamp"]):
        raise ReceiptFormatError("checkpoint.timestamp must be RFC 3339 UTC with microseconds")
    if not isinstance(cp["key_id"], str) or not KEY_ID.fullmatch(cp["key_id"]):
        raise ReceiptFormatError("checkpoint.key_id must be ed25519: + 32 lowercase hex")
    if not isinstance(cp["signature"], str):
        raise ReceiptFormatError("checkpoint.signature must be a base64 string")


def checkpoint_problem(cp: object, keyring: KeyRing) -> str | None:
    """Why `cp` cannot be trusted (malformed, unknown key, bad signature, a key outside its
    recorded ranges), or None."""
    problem = checkpoint_signature_problem(cp, keyring)
    if problem is not None:
        return problem
    assert isinstance(cp, Mapping)
    if not keyring.allows_checkpoint(cp["key_id"], cp["chain"], cp["tree_size"]):
        return (
            f"checkpoint of tree size {cp['tree_size']} signed by key {cp['key_id']}, whose"
            f" recorded turns on chain {cp['chain']!a} all end before that size (a retired key)"
        )
    return None


def checkpoint_signature_problem(cp: object, keyring: KeyRing) -> str | None:
    """Why `cp` is not a checkpoint signed by a key of `keyring` (malformed, unknown key, bad
    signature), or None; whether the key's recorded turns cover it is checkpoint_problem's."""
    try:
        check_checkpoint(cp)
    except ReceiptFormatError as exc:
        return str(exc)
    assert isinstance(cp, Mapping)
    if cp["key_id"] not in keyring:
        return f"checkpoint signed by unknown key {cp['key_id']}"
    signature = decode_signature(cp["signature"])
    if signature is None:
        return "checkpoint signature is not 64 bytes in canonical base64"
    unsigned = {k: cp[k] for k in CHECKPOINT_FIELDS if k != "signature"}
    if not keyring.verify(cp["key_id"], canonical_json(unsigned), signature):
        return "checkpoint signature does not verify"
    return None
