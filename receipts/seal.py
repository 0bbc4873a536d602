"""Sealing: the only place a receipt is made.

seal() fixes a draft's seq and prev_hash on the chain head, hashes the canonical body and signs
the 32 raw bytes of that hash (receipt-format.md sections 3 and 5). Verification is apart, in
receipts.chain.
"""

from __future__ import annotations

import base64

from receipts.errors import ReceiptFormatError
from receipts.manifest import manifest_hash
from receipts.record import (
    FORMAT_VERSION,
    GENESIS_PREV_HASH,
    Receipt,
    ReceiptDraft,
    entry_hash_of,
    new_receipt_id,
)
from receipts.signing import Signer
from receipts.times import utc_now


def seal(
    draft: ReceiptDraft,
    *,
    seq: int,
    prev_hash: str,
    signer: Signer,
    receipt_id: str | None = None,
) -> Receipt:
    """The receipt for `draft` at `seq` after the receipt whose entry hash is `prev_hash`."""
    if type(seq) is not int or seq < 1:
        raise ReceiptFormatError("seq must be a positive integer")
    if seq == 1 and prev_hash != GENESIS_PREV_HASH:
        raise ReceiptFormatError("seq 1 must follow the genesis prev_hash (64 zeros)")
    body = {
        "v": FORMAT_VERSION,
        "id": receipt_id or new_receipt_id(),
        "chain": draft.tenant,
        "seq": seq,
        "prev_hash": prev_hash,
        "created_at": utc_now(),
        "tenant": draft.tenant,
        "key_id": signer.key_id,
        "manifest_hash": manifest_hash(draft.manifest),
        "manifest": draft.manifest,
        "request": draft.request,
        "output": draft.output,
        "finish_reason": draft.finish_reason,
        "usage": draft.usage,
        "validation": draft.validation,
        "fallback": draft.fallback,
        "links": draft.links,
    }
    entry_hash = entry_hash_of(body)
    signature = signer.sign(bytes.fromhex(entry_hash))
    # from_json_obj re-checks the whole shape (the caller's id and prev_hash, and draft dicts
    # mutated since the draft was checked), so a malformed receipt never reaches the ledger.
    return Receipt.from_json_obj(
        {**body, "entry_hash": entry_hash, "signature": base64.b64encode(signature).decode()}
    )
