"""Export of a chain's receipts as a bundle (receipts.bundle_writer) that verifies offline."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

from receipts import key_ranges, queries
from receipts.bundle_writer import ReceiptLine, write_bundle
from receipts.canonical import canonical_json, canonical_plain, loads_plain
from receipts.errors import ChainDamaged, OutOfRange, ReceiptsError
from receipts.ledger_proofs import with_stored_tree
from receipts.merkle import compact_range
from receipts.record import GENESIS_PREV_HASH
from receipts.times import rfc3339


def export_bundle(
    reading: Callable[[], AbstractContextManager[sa.Connection]],
    tenant: str,
    out: str | Path | IO[bytes],
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    *,
    sign_checkpoint: Callable[[str], dict[str, Any]] | None = None,
    should_stop: queries.ShouldStop | None = None,
) -> None:
    """Write the bundle of the tenant's receipts created in [since, until) to ``out``.

    Open-ended (no ``until``), the bundle runs to a signed checkpoint of the whole chain:
    one signed now at the head by ``sign_checkpoint`` when given, else the latest stored. Any
    receipt missing below that checkpoint then shows as a truncation in the bundle. With
    ``until``, it ends at the last receipt in the range and carries the compact range
    that ties it to a later checkpoint's root; a range not starting at seq 1 carries the
    previous entry hash and the compact range to its left. ``should_stop`` is asked between
    receipts; when it says so, Stopped is raised (``out`` is then an unfinished bundle).
    """
    with reading() as conn:
        span = queries.seq_range(
            conn,
            tenant,
            None if since is None else rfc3339(since),
            None if until is None else rfc3339(until),
        )
        stored = (
            queries.latest_checkpoint(conn, tenant)
            if until is None or span is None
            else queries.checkpoint_at_least(conn, tenant, span[1])
        )
    if span is None:
        where = "in that time range" if since or until else "yet"
        raise OutOfRange(f"chain {tenant!r} has no receipts {where}")
    first, last = span
    checkpoint = (
        sign_checkpoint(tenant)
        if sign_checkpoint is not None and (until is None or stored is None)
        else stored
    )
    if checkpoint is None or checkpoint["tree_size"] < first:
        uncovered = last if until is not None else first  # with until: checkpoint >= last
        raise ReceiptsError(
            f"no signed checkpoint covers seq {uncovered} of chain {tenant!r}:"
            " export with the signing key so one can be signed"
        )
    if until is None:
        last = checkpoint["tree_size"]
    with reading() as conn:
        prev = GENESIS_PREV_HASH if first == 1 else queries.entry_hash(conn, tenant, first - 1)
        if prev is None:
            raise ChainDamaged(
                f"receipt seq {first - 1} of chain {tenant!r} is missing:"
                " the range cannot be tied to the chain"
            )
        left, right = with_stored_tree(
            conn,
            tenant,
            lambda subtree: (
                compact_range(0, first - 1, subtree),
                compact_range(last, checkpoint["tree_size"], subtree),
            ),
        )
        public_keys = key_ranges.public_keys(conn, tenant)

    def receipts() -> Iterator[ReceiptLine]:
        """The range's rows, read anew on each call (write_bundle reads them twice)."""
        with reading() as conn:
            rows = queries.stream_rows(conn, tenant, first, last, should_stop)
            yield from _consecutive(rows, tenant, first, last)

    def schemas() -> Iterator[tuple[str, bytes]]:
        """The schemas the range binds, read anew on each call (write_bundle reads them
        twice, so a range of many distinct tool sets is never held in memory)."""
        with reading() as conn:
            yield from queries.bound_schemas(conn, tenant, first, last, should_stop)

    write_bundle(
        out,
        receipts,
        schemas,
        public_keys,
        checkpoint,
        prev_entry_hash=prev,
        proofs={"left": [h.hex() for h in left], "right": [h.hex() for h in right]},
    )


def _consecutive(
    rows: Iterator[sa.Row], tenant: str, first: int, last: int
) -> Iterator[ReceiptLine]:
    """The bundle's lines of consecutive receipts: a database that lost or reordered rows is
    ChainDamaged naming the first seq out of place (an export that quietly stopped there read
    as a truncated chain). A stored body is compact JSON with sorted keys; most are already
    canonical, and loads_plain tells those apart at C speed."""
    expected = first
    for row in rows:
        text = row.body.encode()
        obj = loads_plain(text)
        line = canonical_plain(obj) if obj is not None else canonical_json(obj := json.loads(text))
        if row.seq != expected or not isinstance(obj, dict) or obj.get("seq") != expected:
            raise ChainDamaged(
                f"chain {tenant!r}: receipt seq {expected} is missing or out of place"
            )
        yield ReceiptLine(obj.get("chain"), expected, line)
        expected += 1
    if expected <= last:
        raise ChainDamaged(f"chain {tenant!r}: receipt seq {expected} is missing")
