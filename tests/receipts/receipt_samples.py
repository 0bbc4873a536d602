"""Small, real receipt inputs for the receipts tests: a two-tool union schema and drafts."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from receipts.manifest import build_manifest, schema_hash
from receipts.record import GENESIS_PREV_HASH, Receipt, ReceiptDraft
from receipts.seal import seal
from receipts.signing import Signer

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city"],
    "additionalProperties": False,
}
EMAIL = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
    "required": ["to", "body"],
    "additionalProperties": False,
}
# The shape runtime.union_schema.union_schema produces: one oneOf branch per tool plus an answer.
UNION = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"tool": {"const": "get_weather"}, "arguments": WEATHER},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"tool": {"const": "send_email"}, "arguments": EMAIL},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    ]
}
UNION_HASH = schema_hash(UNION)
SCHEMAS = {UNION_HASH: UNION}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(model: str = "SmolLM2-135M-Instruct") -> dict[str, Any]:
    return build_manifest(
        schema_hash=UNION_HASH,
        model=model,
        weights_digest=digest("weights"),
        tokenizer_digest=digest("tokenizer"),
        engine="embedded",
        backend="llguidance",
        renderer="generic",
        sampling={"temperature": 0.0, "top_p": 1.0, "seed": 7, "max_tokens": 128},
        constraint_kind="tools",
    )


def draft(tenant: str = "acme", city: str = "Paris", **arguments: Any) -> ReceiptDraft:
    return ReceiptDraft(
        tenant=tenant,
        manifest=manifest(),
        schema=UNION,
        request={"messages_sha256": digest("messages " + city), "params_sha256": digest("p")},
        output={
            "kind": "tool_calls",
            "tool_calls": [
                {
                    "id": "call_" + secrets.token_hex(12),
                    "name": "get_weather",
                    "arguments": {"city": city, **arguments},
                }
            ],
            "content_sha256": None,
        },
        finish_reason="tool_calls",
        usage={"prompt_tokens": 42, "completion_tokens": 17},
        validation={"valid": True, "errors": []},
        fallback=None,
        links=[],
    )


def build_chain(signer: Signer, n: int, tenant: str = "acme") -> list[Receipt]:
    """n receipts sealed through the real seal() path, seq 1..n."""
    receipts: list[Receipt] = []
    prev = GENESIS_PREV_HASH
    for seq in range(1, n + 1):
        r = seal(
            draft(tenant, city=f"City {seq}", days=1 + seq % 14),
            seq=seq,
            prev_hash=prev,
            signer=signer,
        )
        receipts.append(r)
        prev = r.entry_hash
    return receipts
