"""Receipt format version 1: the draft a caller supplies and the sealed, immutable receipt.

Validation here is structural (fields, types, id shapes), so a malformed draft is refused
before it is signed and a malformed stored receipt is named instead of crashing a verifier.
The cryptographic checks live in chain.py.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

from receipts.canonical import canonical_json, hash_json, sha256_hex
from receipts.errors import ReceiptFormatError
from receipts.manifest import check_manifest, is_hex64, schema_hash
from receipts.times import is_timestamp

FORMAT_VERSION = 1
GENESIS_PREV_HASH = "0" * 64

RECEIPT_ID = re.compile(r"rcpt_[0-9a-f]{24}")
CALL_ID = re.compile(r"call_[0-9a-f]{24}")
KEY_ID = re.compile(r"ed25519:[0-9a-f]{32}")
OUTPUT_KINDS = frozenset({"tool_calls", "answer", "parsed", "text"})
# Where a receipt keeps its request itself (retention on): the JSON text of messages and
# params in the client's member order, each checked against its digest.
PAYLOAD_MEMBERS = ("payload_json",)
# Who asked: the gateway's API key id and the id of the HTTP request (its x-request-id).
CALLER_MEMBERS = {
    "api_key_id": re.compile(r"key_[0-9a-f]{16}"),
    "request_id": re.compile(r"req_[0-9a-f]{24}"),
}


def new_receipt_id() -> str:
    """ "rcpt_" + 24 lowercase hex from the OS CSPRNG."""
    return "rcpt_" + secrets.token_hex(12)


def _fail(path: str, want: str) -> ReceiptFormatError:
    return ReceiptFormatError(f"{path} must be {want}")


@cache
def _keysets(required: tuple[str, ...], optional: tuple[str, ...]) -> tuple[frozenset, frozenset]:
    return frozenset(required), frozenset(required + optional)


def _obj(value: object, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()):
    if not isinstance(value, dict):
        raise _fail(path, "an object")
    must, may = _keysets(required, optional)
    keys = value.keys()
    if not (keys >= must and keys <= may):
        raise _fail(path, f"an object with fields {list(required)} (optional {list(optional)})")
    return value


def _hex64(value: object, path: str, nullable: bool = False) -> None:
    if not (is_hex64(value) or (nullable and value is None)):
        raise _fail(path, "64 lowercase hex" + (" or null" if nullable else ""))


def _str(value: object, path: str, nullable: bool = False) -> None:
    if not (isinstance(value, str) or (nullable and value is None)):
        raise _fail(path, "a string" + (" or null" if nullable else ""))


def _count(value: object, path: str) -> None:
    if type(value) is not int or value < 0:
        raise _fail(path, "a non-negative integer")


def check_request(request: object) -> None:
    _obj(
        request,
        "request",
        ("messages_sha256", "params_sha256"),
        PAYLOAD_MEMBERS + tuple(CALLER_MEMBERS),
    )
    _hex64(request["messages_sha256"], "request.messages_sha256")
    _hex64(request["params_sha256"], "request.params_sha256")
    for member, shape in CALLER_MEMBERS.items():
        value = request.get(member)
        if member in request and not (isinstance(value, str) and shape.fullmatch(value)):
            raise _fail(f"request.{member}", f"a string like {shape.pattern}")
    if "payload_json" in request:
        texts = _obj(request["payload_json"], "request.payload_json", ("messages", "params"))
        for part, kind in (("messages", list), ("params", dict)):
            _check_payload_text(texts[part], kind, request[f"{part}_sha256"], part)


def _check_payload_text(text: object, kind: type, digest: str, part: str) -> None:
    """The retained text is what the receipt's digest commits to."""
    path = f"request.payload_json.{part}"
    try:
        value = json.loads(text) if isinstance(text, str) else None
        matches = isinstance(value, kind) and hash_json(value) == digest
    except (ValueError, RecursionError):  # not JSON, or no canonical form (CanonicalizationError)
        matches = False
    if not matches:
        shape = "an array" if kind is list else "an object"
        raise _fail(path, f"the JSON text of {shape} whose hash_json is request.{part}_sha256")


def check_output(output: object) -> None:
    _obj(output, "output", ("kind", "tool_calls", "content_sha256"))
    if output["kind"] not in OUTPUT_KINDS:
        raise _fail("output.kind", f"one of {sorted(OUTPUT_KINDS)}")
    calls = output["tool_calls"]
    if not isinstance(calls, list) or (output["kind"] == "tool_calls") != bool(calls):
        raise _fail("output.tool_calls", 'a list, non-empty exactly when kind is "tool_calls"')
    for i, call in enumerate(calls):
        path = f"output.tool_calls[{i}]"
        _obj(call, path, ("id", "name", "arguments"))
        if not isinstance(call["id"], str) or not CALL_ID.fullmatch(call["id"]):
            raise _fail(f"{path}.id", "call_ + 24 lowercase hex")
        if not isinstance(call["name"], str) or not call["name"]:
            raise _fail(f"{path}.name", "a non-empty string")
        if not isinstance(call["arguments"], dict):
            raise _fail(f"{path}.arguments", "an object")
    _hex64(output["content_sha256"], "output.content_sha256", nullable=True)


def check_usage(usage: object) -> None:
    _obj(usage, "usage", ("prompt_tokens", "completion_tokens"))
    _count(usage["prompt_tokens"], "usage.prompt_tokens")
    _count(usage["completion_tokens"], "usage.completion_tokens")


def check_validation(validation: object) -> None:
    _obj(validation, "validation", ("valid", "errors"))
    if not isinstance(validation["valid"], bool):
        raise _fail("validation.valid", "a boolean")
    errors = validation["errors"]
    if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
        raise _fail("validation.errors", "a list of strings")


# What the ledger's link column takes: any client's call id (not only call_<24 hex>), but
# bounded and printable. Checked on drafts (receipts already sealed verify as they were).
LINKED_CALL_ID = re.compile(r"[\x20-\x7e]{1,64}")


def _check_linked_call_ids(links: list[dict[str, Any]]) -> None:
    """A draft whose link the database would refuse is refused alone, here: in the group
    commit it failed every receipt of the batch, other tenants' too."""
    for i, link in enumerate(links):
        if not LINKED_CALL_ID.fullmatch(link["tool_call_id"]):
            raise _fail(f"links[{i}].tool_call_id", "1-64 printable ASCII characters")


def check_links(links: object) -> None:
    if not isinstance(links, list):
        raise _fail("links", "a list")
    for i, link in enumerate(links):
        _obj(link, f"links[{i}]", ("tool_call_id", "receipt_id"))
        _str(link["tool_call_id"], f"links[{i}].tool_call_id")
        rid = link["receipt_id"]
        if rid is not None and not (isinstance(rid, str) and RECEIPT_ID.fullmatch(rid)):
            raise _fail(f"links[{i}].receipt_id", "rcpt_ + 24 lowercase hex or null")


@dataclass(frozen=True)
class ReceiptDraft:
    """Everything about one request/response the caller knows; the chain adds the rest.

    `schema` is the schema the manifest's schema_hash binds (None for regex, EBNF or no
    constraint); the ledger stores it content addressed, it is not part of the receipt.
    """

    tenant: str
    manifest: dict[str, Any]
    schema: dict[str, Any] | None
    request: dict[str, Any]
    output: dict[str, Any]
    finish_reason: str
    usage: dict[str, Any]
    validation: dict[str, Any]
    fallback: str | None = None
    links: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not self.tenant:
            raise _fail("tenant", "a non-empty string")
        object.__setattr__(self, "links", list(self.links))
        check_manifest(self.manifest)
        bound = self.manifest["schema_hash"]
        if (self.schema is None) != (bound is None):
            raise ReceiptFormatError(
                "schema must be given exactly when manifest.schema_hash is set"
            )
        if self.schema is not None and schema_hash(self.schema) != bound:
            raise ReceiptFormatError("schema does not hash to manifest.schema_hash")
        check_request(self.request)
        check_output(self.output)
        _str(self.finish_reason, "finish_reason")
        check_usage(self.usage)
        check_validation(self.validation)
        _str(self.fallback, "fallback", nullable=True)
        check_links(self.links)
        _check_linked_call_ids(self.links)


@dataclass(frozen=True)
class Receipt:
    """A sealed receipt (format v1). Field order is the order of the JSON object."""

    v: int
    id: str
    chain: str
    seq: int
    prev_hash: str
    created_at: str
    tenant: str
    key_id: str
    manifest_hash: str
    manifest: dict[str, Any]
    request: dict[str, Any]
    output: dict[str, Any]
    finish_reason: str
    usage: dict[str, Any]
    validation: dict[str, Any]
    fallback: str | None
    links: list[dict[str, Any]]
    entry_hash: str
    signature: str

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.output["tool_calls"]

    def body(self) -> dict[str, Any]:
        """The object the entry hash covers: every field except entry_hash and signature."""
        return {f: getattr(self, f) for f in BODY_FIELDS}

    def to_json_obj(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in RECEIPT_FIELDS}

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> Receipt:
        """Parse and structurally check a receipt object (unknown or missing fields refused)."""
        _obj(obj, "receipt", RECEIPT_FIELDS)
        check_envelope(obj)
        return cls(**obj)


RECEIPT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Receipt))
BODY_FIELDS: tuple[str, ...] = tuple(
    f for f in RECEIPT_FIELDS if f not in ("entry_hash", "signature")
)


def check_envelope(obj: Mapping[str, Any]) -> None:
    """Structural checks of a whole receipt object (types and shapes, not hashes)."""
    if obj["v"] != FORMAT_VERSION or type(obj["v"]) is not int:
        raise _fail("v", f"{FORMAT_VERSION} (this verifier reads format version 1 only)")
    if not isinstance(obj["id"], str) or not RECEIPT_ID.fullmatch(obj["id"]):
        raise _fail("id", "rcpt_ + 24 lowercase hex")
    _str(obj["chain"], "chain")
    if obj["tenant"] != obj["chain"]:
        raise _fail("tenant", "equal to chain (one chain per tenant)")
    if type(obj["seq"]) is not int or obj["seq"] < 1:
        raise _fail("seq", "a positive integer")
    _hex64(obj["prev_hash"], "prev_hash")
    if not is_timestamp(obj["created_at"]):
        raise _fail("created_at", "RFC 3339 UTC with microseconds and Z")
    if not isinstance(obj["key_id"], str) or not KEY_ID.fullmatch(obj["key_id"]):
        raise _fail("key_id", "ed25519: + 32 lowercase hex")
    _hex64(obj["manifest_hash"], "manifest_hash")
    check_manifest(obj["manifest"])
    check_request(obj["request"])
    check_output(obj["output"])
    _str(obj["finish_reason"], "finish_reason")
    check_usage(obj["usage"])
    check_validation(obj["validation"])
    if obj["output"]["tool_calls"] and not obj["validation"]["valid"]:
        # a false verdict claims no conformance, and exempts the output from the schema check
        raise _fail(
            "validation.valid", "true on a receipt of tool calls (never receipted unchecked)"
        )
    _str(obj["fallback"], "fallback", nullable=True)
    check_links(obj["links"])
    _hex64(obj["entry_hash"], "entry_hash")
    _str(obj["signature"], "signature")


def entry_hash_of(body: Mapping[str, Any]) -> str:
    """hex(SHA-256(JCS(body))), body = the receipt without entry_hash and signature."""
    return sha256_hex(canonical_json(body))
