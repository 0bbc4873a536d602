"""The keys that signed a ledger and the seq ranges each signed, per chain: read from the
key range rows the writer adds when a key takes a chain over, the checkpoints each key
signed, and the hand-over of every chain to the newest key on rotation.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from receipts.queries import chunks
from receipts.signing import PublicKeyEntry
from receipts.store import ChainRow, CheckpointRow, KeyRangeRow, ReceiptRow, SigningKeyRow


def public_keys(conn: sa.Connection, tenant: str | None = None) -> list[PublicKeyEntry]:
    """Every registered key with the seq ranges it signed per chain (KeyRing shape).

    A range ends where the chain's next range starts, or is open (last_seq None) at the head;
    once a newer key is registered, every chain is handed to it (``_hand_over``). A key that
    signed a checkpoint past its last turn (rotated in, or back, and asked for a
    checkpoint or an export before its first receipt) also gets the empty turn it took then,
    ``first_seq`` = size + 1 and ``last_seq`` = size: it signed no receipt there, but that
    checkpoint verifies. With ``tenant``, only that chain's ranges are listed (and only keys
    that signed it).

    ``created_at``: without ``tenant`` (the operator's view), when the key was registered;
    with it, when the key first signed in that chain (the earliest of its first receipt
    there and its first checkpoint there), so that a tenant learns nothing of when another
    chain first used the key. A key that signed nothing of the chain is not listed.
    """
    keys = {
        row.key_id: {
            "key_id": row.key_id,
            "public_key_pem": row.public_key_pem,
            "created_at": row.created_at,
            "ranges": [],
        }
        for row in conn.execute(
            sa.select(SigningKeyRow).order_by(SigningKeyRow.created_at, SigningKeyRow.key_id)
        )
    }
    k = KeyRangeRow.__table__.c
    stmt = sa.select(k.chain, k.first_seq, k.key_id).order_by(k.chain, k.first_seq)
    if tenant is not None:
        stmt = stmt.where(k.chain == tenant)
    rows = conn.execute(stmt).all()
    for row, following in zip(rows, [*rows[1:], None], strict=False):
        same_chain = following is not None and following.chain == row.chain
        last = following.first_seq - 1 if same_chain else None
        keys[row.key_id]["ranges"].append(
            {"chain": row.chain, "first_seq": row.first_seq, "last_seq": last}
        )
    c = CheckpointRow.__table__.c
    signers = sa.select(
        c.chain, c.key_id, sa.func.max(c.tree_size), sa.func.min(c.timestamp)
    ).group_by(c.chain, c.key_id)
    if tenant is not None:
        signers = signers.where(c.chain == tenant)
    first_checkpoint: dict[str, str] = {}
    for chain, key_id, size, signed_at in conn.execute(signers):
        if key_id not in keys:  # signed before checkpoint keys were registered: unlistable
            continue
        first_checkpoint[key_id] = signed_at
        ranges = keys[key_id]["ranges"]
        if not any(
            r["chain"] == chain and (r["last_seq"] is None or r["last_seq"] >= size) for r in ranges
        ):
            ranges.append({"chain": chain, "first_seq": size + 1, "last_seq": size})
    _hand_over(conn, list(keys.values()), tenant)
    if tenant is None:
        return list(keys.values())
    listed = [key for key in keys.values() if key["ranges"]]
    _first_signed_in_chain(conn, tenant, listed, first_checkpoint)
    return listed


def _hand_over(conn: sa.Connection, keys: list[dict[str, Any]], tenant: str | None) -> None:
    """Close every older key's open range at its chain's head and open the newest key's
    after it, on chains the newest has not signed yet too. A rotation otherwise left an idle
    chain's range open under the retired key, which a leaked copy of that key could then
    extend past any key list saved after the rotation (docs/deploy.md, section 3). ``keys``
    are in registration order: a key is registered when it first signs anything."""
    if len(keys) < 2:
        return
    *older, newest = keys
    heads = sa.select(ChainRow.chain, ChainRow.head_seq).where(ChainRow.head_seq > 0)
    if tenant is not None:
        heads = heads.where(ChainRow.chain == tenant)
    for chain, head in conn.execute(heads):
        for key in older:
            for span in key["ranges"]:
                if span["chain"] == chain and span["last_seq"] is None:
                    span["last_seq"] = head
        own = [span for span in newest["ranges"] if span["chain"] == chain]
        if not any(span["last_seq"] is None for span in own):
            # the empty turn of a checkpoint it signed at the head becomes its open range
            newest["ranges"] = [
                span
                for span in newest["ranges"]
                if span["chain"] != chain or span["first_seq"] != head + 1
            ]
            newest["ranges"].append({"chain": chain, "first_seq": head + 1, "last_seq": None})


def _first_signed_in_chain(
    conn: sa.Connection, tenant: str, keys: list[dict[str, Any]], first_checkpoint: dict[str, str]
) -> None:
    """Set each key's created_at to when it first signed in ``tenant``'s chain (its first
    receipt or checkpoint there), or drop it when the chain holds neither any more."""
    r = ReceiptRow.__table__.c
    # A key's turns that hold receipts (not the empty turn of a checkpoint-only signer).
    turns = {
        key["key_id"]: [
            span["first_seq"]
            for span in key["ranges"]
            if span["last_seq"] is None or span["last_seq"] >= span["first_seq"]
        ]
        for key in keys
    }
    starts = sorted({seq for firsts in turns.values() for seq in firsts})
    sealed: dict[int, str] = {}
    for chunk in chunks(starts):
        rows = conn.execute(
            sa.select(r.seq, r.created_at).where(r.chain == tenant, r.seq.in_(chunk))
        )
        sealed |= {row.seq: row.created_at for row in rows}
    for key in keys:
        times = [sealed[seq] for seq in turns[key["key_id"]] if seq in sealed]
        if key["key_id"] in first_checkpoint:
            times.append(first_checkpoint[key["key_id"]])
        if times:
            key["created_at"] = min(times)
        else:
            del key["created_at"]
