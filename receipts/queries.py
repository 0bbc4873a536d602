"""Read side of the ledger: the audit queries, checkpoint listings, and the rows a
verifier or a Merkle proof needs. Every function takes an open SQLAlchemy connection and
turns stored receipt JSON back into receipts; none of them writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from receipts.errors import ChainDamaged, ReceiptFormatError, Stopped
from receipts.record import Receipt
from receipts.store import (
    CallRow,
    ChainRow,
    CheckpointRow,
    LinkRow,
    MerkleNodeRow,
    ReceiptRow,
    SchemaRow,
)
from receipts.times import rfc3339

MAX_PAGE = 1000
PAGE_BYTES = 4 * 2**20
"""A page of receipts ends after the receipt that takes its stored receipts past this many
bytes (so a page always holds at least one, and its next_cursor continues after it): an
agent can make each receipt large, and ``limit`` alone bounds rows, not bytes."""
CALLS_PER_QUERY = 32
"""Tool call ids looked up per query (`issuers`): an agent's loop rarely answers more, and
the rows of a query are held at once, each a whole receipt (with retained payloads up to
about max_body_bytes)."""
ANSWERS = 100
"""At most this many answering receipts per /audit/calls answer (within PAGE_BYTES too)."""
STREAM_CHUNK = 2000
SCHEMA_CHUNK = 64  # schemas of up to some 64 KiB each (the gateway's limit)
ShouldStop = Callable[[], bool]  # asked between receipts by whole-chain work: give up now?


@dataclass(frozen=True)
class ReceiptQuery:
    """Filters of an audit listing. Times are datetimes or RFC 3339 strings; ``since`` is
    inclusive, ``until`` exclusive. ``call_id``: the receipt that issued that tool call;
    ``answering``: receipts whose request carried a tool result for that call (their links
    name it). ``after_seq`` is the cursor a previous page returned."""

    tenant: str
    since: datetime | str | None = None
    until: datetime | str | None = None
    tool_name: str | None = None
    model: str | None = None
    schema_hash: str | None = None
    call_id: str | None = None
    answering: str | None = None
    after_seq: int | None = None
    limit: int = 100


@dataclass(frozen=True)
class ReceiptPage:
    items: list[Receipt] = field(default_factory=list)
    next_cursor: int | None = None
    """Pass as ``after_seq`` to get the next page; None on the last page. A page ends at
    ``limit`` receipts or after the one that passes PAGE_BYTES, whichever comes first."""


def receipt_from_body(body: str, seq: int) -> Receipt:
    """The receipt stored at ``seq``; one that no longer parses is damage to the chain
    (ChainDamaged, naming the seq), not a fault in the request that read it."""
    try:
        return Receipt.from_json_obj(json.loads(body))
    except (ValueError, ReceiptFormatError) as exc:
        raise ChainDamaged(f"the receipt stored at seq {seq} is malformed ({exc})") from None


def query(conn: sa.Connection, q: ReceiptQuery) -> ReceiptPage:
    """One page of a tenant's receipts matching every given filter, in seq order: at most
    ``limit`` of them, ending early after the receipt that takes the page past PAGE_BYTES
    of stored receipts. ``next_cursor`` is the seq of the last row the page took (None when
    no row follows), so the next page goes on from there and none is skipped.

    The sizes are read first (no bodies), then only the bodies the page takes: a page never
    holds more than PAGE_BYTES plus one receipt, whatever ``limit`` says."""
    if not 1 <= q.limit <= MAX_PAGE:
        raise ReceiptFormatError(f"limit must be between 1 and {MAX_PAGE}, got {q.limit}")
    r = ReceiptRow.__table__.c
    since = rfc3339(q.since) if q.since is not None else None
    until = rfc3339(q.until) if q.until is not None else None
    where = _filters(q, since, until)
    sizes = conn.execute(
        sa.select(r.seq, _octets(conn, r.body)).where(*where).order_by(r.seq).limit(q.limit + 1)
    ).all()
    taken = total = 0
    for _, size in sizes:
        if taken == q.limit or (taken and total >= PAGE_BYTES):
            break
        taken, total = taken + 1, total + (size or 0)
    if not taken:
        return ReceiptPage([], None)
    last = sizes[taken - 1].seq
    within = _filters(q, since, until, through=last)
    rows = conn.execute(sa.select(r.seq, r.body).where(*within).order_by(r.seq).limit(taken))
    items = ((row.seq, receipt_from_body(row.body, row.seq)) for row in rows)
    matching = [i for seq, i in items if _body_matches(i, seq, q, since, until)]
    return ReceiptPage(matching, last if taken < len(sizes) else None)


def _filters(
    q: ReceiptQuery, since: str | None, until: str | None, through: int | None = None
) -> list[sa.ColumnElement[bool]]:
    """The WHERE clauses of ``q`` on the receipts table, up to seq ``through`` (the indexed
    copies; each body read is checked against the filters again by _body_matches).

    The call and link filters take their seqs from the index tables (an uncorrelated IN,
    read through those tables' own indexes), and the seq bounds then go there alone: a
    correlated EXISTS was probed once per receipt, and with a seq range on the receipts
    themselves SQLite walks that range instead, so either way a call id that matches nothing
    cost a walk of the whole chain."""
    r = ReceiptRow.__table__.c
    where = [r.chain == q.tenant]
    if since is not None:
        where.append(r.created_at >= since)
    if until is not None:
        where.append(r.created_at < until)
    if q.model is not None:
        where.append(r.model == q.model)
    if q.schema_hash is not None:
        where.append(r.schema_hash == q.schema_hash)
    calls, lk = CallRow.__table__.c, LinkRow.__table__.c
    named = [
        (table, column == value)
        for table, column, value in (
            (calls, calls.tool_name, q.tool_name),
            (calls, calls.call_id, q.call_id),
            (lk, lk.tool_call_id, q.answering),
        )
        if value is not None
    ]
    for table, match in named:
        seqs = [table.chain == q.tenant, match, *_seq_bounds(table.seq, q.after_seq, through)]
        where.append(r.seq.in_(sa.select(table.seq).where(*seqs)))
    if not named:
        where += _seq_bounds(r.seq, q.after_seq, through)
    return where


def _seq_bounds(
    seq: sa.ColumnElement[int], after: int | None, through: int | None
) -> list[sa.ColumnElement[bool]]:
    """``after < seq <= through``, each bound when given."""
    return [
        *([seq > after] if after is not None else []),
        *([seq <= through] if through is not None else []),
    ]


def _octets(conn: sa.Connection, text: sa.ColumnElement[str]) -> sa.ColumnElement[int]:
    """The stored size of a text column in bytes, read without fetching it (Postgres reads
    the size of a TOASTed value from its header; SQLite counts a BLOB's bytes)."""
    if conn.dialect.name == "sqlite":
        return sa.func.length(sa.cast(text, sa.LargeBinary))
    return sa.func.octet_length(text)


def _stored_as(receipt: Receipt, tenant: str, seq: int) -> bool:
    """Whether the signed body is the receipt its row claims to be: of ``tenant``'s chain, at
    the row's seq. The row's chain and seq columns are copies an attacker with write access
    could forge (moving another tenant's signed receipt into this chain: verify names such a
    row); a read never answers from them, so that receipt is never shown to this tenant."""
    return receipt.chain == tenant and receipt.seq == seq


def _body_matches(
    receipt: Receipt, seq: int, q: ReceiptQuery, since: str | None, until: str | None
) -> bool:
    """The filters again, on the signed body: the indexed columns and rows the SQL filtered
    on are copies an attacker with write access could forge (verify names such a row), and
    a listing must not answer from them meanwhile."""
    return (
        _stored_as(receipt, q.tenant, seq)
        and (since is None or receipt.created_at >= since)
        and (until is None or receipt.created_at < until)
        and (q.model is None or receipt.manifest["model"] == q.model)
        and (q.schema_hash is None or receipt.manifest["schema_hash"] == q.schema_hash)
        and (q.tool_name is None or any(c["name"] == q.tool_name for c in receipt.tool_calls))
        and (q.call_id is None or _issued(receipt, q.call_id))
        and (q.answering is None or _answers(receipt, q.answering))
    )


def _issued(receipt: Receipt, call_id: str) -> bool:
    """Whether the signed body issued tool call ``call_id`` (not only an index row says so)."""
    return any(c["id"] == call_id for c in receipt.tool_calls)


def _answers(receipt: Receipt, call_id: str) -> bool:
    """Whether the signed body's links name tool call ``call_id`` (not only an index row)."""
    return any(lk["tool_call_id"] == call_id for lk in receipt.links)


def _one(
    conn: sa.Connection, tenant: str, stmt: sa.Select[Any], params: dict[str, Any] | None = None
) -> Receipt | None:
    """The receipt of the row ``stmt`` (selecting seq and body) finds, if its signed body is
    the tenant's receipt at that seq (else None: a forged row is not found, see _stored_as)."""
    row = conn.execute(stmt, params).first()
    if row is None:
        return None
    receipt = receipt_from_body(row.body, row.seq)
    return receipt if _stored_as(receipt, tenant, row.seq) else None


def get(conn: sa.Connection, tenant: str, receipt_id: str) -> Receipt | None:
    r = ReceiptRow.__table__.c
    stmt = sa.select(r.seq, r.body).where(r.id == receipt_id, r.chain == tenant)
    receipt = _one(conn, tenant, stmt)
    return receipt if receipt is not None and receipt.id == receipt_id else None


_R, _C = ReceiptRow.__table__.c, CallRow.__table__.c
_ISSUED = (
    sa.select(_C.call_id, _R.seq, _R.body)
    .join_from(ReceiptRow, CallRow, sa.and_(_C.chain == _R.chain, _C.seq == _R.seq))
    .where(_C.chain == sa.bindparam("tenant"))
    .where(_C.call_id.in_(sa.bindparam("call_ids", expanding=True)))
)
"""The tenant's receipt_calls rows of some call ids, joined to the receipts they name:
call_id, seq, body. Built once: building and keying this select anew for each request cost
more CPU than running it (0.38 against 0.15 ms for ten ids on Postgres)."""


def find_call(conn: sa.Connection, tenant: str, call_id: str) -> Receipt | None:
    """The receipt whose output issued tool call ``call_id``."""
    receipt = _one(conn, tenant, _ISSUED, {"tenant": tenant, "call_ids": [call_id]})
    if receipt is None or not _issued(receipt, call_id):
        return None  # no receipt, or only a forged receipt_calls row names one
    return receipt


def issuers(conn: sa.Connection, tenant: str, call_ids: Collection[str]) -> dict[str, str]:
    """The id of the receipt that issued each of ``call_ids`` (an id none issued is absent),
    checked against the signed bodies as find_call checks them. An agent's request carries
    every tool result of its loop so far: a transaction per id cost four round trips each
    on Postgres, so these are read CALLS_PER_QUERY at a time, and of each body only its id
    and the calls it issued are kept."""
    found: dict[str, str] = {}
    issued_by: dict[int, tuple[str, frozenset[str]] | None] = {}  # parallel calls: one body
    for chunk in chunks(list(dict.fromkeys(call_ids)), CALLS_PER_QUERY):
        for row in conn.execute(_ISSUED, {"tenant": tenant, "call_ids": chunk}):
            if row.seq not in issued_by:
                receipt = receipt_from_body(row.body, row.seq)
                issued_by[row.seq] = (
                    (receipt.id, frozenset(c["id"] for c in receipt.tool_calls))
                    if _stored_as(receipt, tenant, row.seq)
                    else None
                )
            if (issuer := issued_by[row.seq]) is not None and row.call_id in issuer[1]:
                found[row.call_id] = issuer[0]  # else only a forged receipt_calls row names one
    return found


def answers_to(
    conn: sa.Connection, tenant: str, call_id: str, after_seq: int | None = None
) -> ReceiptPage:
    """Receipts whose request carried a tool result for ``call_id`` (their links name it):
    the first ANSWERS of them (fewer when they pass PAGE_BYTES); ``next_cursor`` continues
    the same listing (``answering=call_id``) when there are more."""
    return query(
        conn, ReceiptQuery(tenant=tenant, answering=call_id, after_seq=after_seq, limit=ANSWERS)
    )


def schema(conn: sa.Connection, schema_hash: str) -> dict[str, Any] | None:
    body = conn.scalar(sa.select(SchemaRow.body).where(SchemaRow.hash == schema_hash))
    return json.loads(body) if body is not None else None


def bound_schemas(
    conn: sa.Connection,
    tenant: str,
    first: int,
    last: int,
    should_stop: ShouldStop | None = None,
) -> Iterator[tuple[str, bytes]]:
    """The schemas the chain's receipts first..last bind, as stored (canonical JSON), in hash
    order (for an export), in keyset-paginated chunks along the (chain, schema_hash, seq)
    index: a range of many distinct tool sets streams in constant memory (SCHEMA_CHUNK
    schemas at a time). A bound schema the database lacks is left out (the bundle then
    fails verification, naming the receipt that binds it)."""
    r = ReceiptRow.__table__.c
    after = ""
    while True:
        hashes = list(
            conn.scalars(
                sa.select(r.schema_hash)
                .distinct()
                .where(r.chain == tenant, r.schema_hash > after, r.seq.between(first, last))
                .order_by(r.schema_hash)
                .limit(SCHEMA_CHUNK)
            )
        )
        if not hashes:
            return
        if should_stop is not None and should_stop():
            raise Stopped(f"stopped reading the schemas of chain {tenant!r}, as asked")
        rows = conn.execute(
            sa.select(SchemaRow.hash, SchemaRow.body)
            .where(SchemaRow.hash.in_(hashes))
            .order_by(SchemaRow.hash)
        )
        for row in rows:
            yield row.hash, row.body.encode()
        if len(hashes) < SCHEMA_CHUNK:
            return
        after = hashes[-1]


def head_row(conn: sa.Connection, tenant: str) -> ChainRow | None:
    """The chain's row in `chains` (head seq and hash, Merkle frontier, signing key, latest
    checkpoint's size and time), or None before its first append; not to be confused with
    receipts.chain_head.ChainHead, the writer's in-memory copy of that row."""
    return conn.execute(sa.select(ChainRow).where(ChainRow.chain == tenant)).first()


def chains(conn: sa.Connection) -> list[str]:
    return list(conn.scalars(sa.select(ChainRow.chain).order_by(ChainRow.chain)))


def latest_checkpoint(
    conn: sa.Connection, tenant: str, max_size: int | None = None
) -> dict[str, Any] | None:
    """The newest stored checkpoint of the chain (of size <= ``max_size`` when given)."""
    c = CheckpointRow.__table__.c
    stmt = sa.select(c.body).where(c.chain == tenant)
    if max_size is not None:
        stmt = stmt.where(c.tree_size <= max_size)
    body = conn.scalar(stmt.order_by(c.tree_size.desc()).limit(1))
    return json.loads(body) if body is not None else None


def checkpoints(
    conn: sa.Connection, tenant: str, first_size: int, last_size: int
) -> dict[int, dict[str, Any]]:
    """The chain's stored checkpoints of sizes first_size..last_size, by size."""
    c = CheckpointRow.__table__.c
    stmt = sa.select(c.body).where(c.chain == tenant, c.tree_size.between(first_size, last_size))
    return {cp["tree_size"]: cp for cp in map(json.loads, conn.scalars(stmt))}


def checkpoint_at(conn: sa.Connection, tenant: str, size: int) -> dict[str, Any] | None:
    """The stored checkpoint of exactly ``size`` receipts, if any."""
    c = CheckpointRow.__table__.c
    body = conn.scalar(sa.select(c.body).where(c.chain == tenant, c.tree_size == size))
    return json.loads(body) if body is not None else None


def checkpoint_at_least(conn: sa.Connection, tenant: str, size: int) -> dict[str, Any] | None:
    """The smallest stored checkpoint covering at least ``size`` receipts."""
    c = CheckpointRow.__table__.c
    body = conn.scalar(
        sa.select(c.body)
        .where(c.chain == tenant, c.tree_size >= size)
        .order_by(c.tree_size)
        .limit(1)
    )
    return json.loads(body) if body is not None else None


def stream_rows(
    conn: sa.Connection,
    tenant: str,
    from_seq: int = 1,
    to_seq: int | None = None,
    should_stop: ShouldStop | None = None,
) -> Iterator[sa.Row]:
    """Receipt rows of one chain in seq order, fetched in keyset-paginated chunks so a
    million-row chain streams in constant memory on both databases. ``should_stop`` is
    asked before each row: when it says so, Stopped is raised (whole-chain work whose
    caller has gone must give its thread back within a receipt, not at the chain's end)."""
    r = ReceiptRow.__table__.c
    after = from_seq - 1
    while True:
        stmt = sa.select(ReceiptRow.__table__).where(r.chain == tenant, r.seq > after)
        if to_seq is not None:
            stmt = stmt.where(r.seq <= to_seq)
        rows = conn.execute(stmt.order_by(r.seq).limit(STREAM_CHUNK)).all()
        for row in rows:
            if should_stop is not None and should_stop():
                raise Stopped(f"stopped at seq {row.seq} of chain {tenant!r}, as asked")
            yield row
        if len(rows) < STREAM_CHUNK:
            return
        after = rows[-1].seq


@dataclass(frozen=True)
class IndexRows:
    """A window of the receipt_calls and receipt_links rows (copies of each receipt's tool
    calls and links that only the audit queries use), keyed by seq."""

    calls: dict[int, set[tuple[str, str]]]  # seq -> {(call_id, tool_name)}
    links: dict[int, list[tuple[str, str | None]]]  # seq -> [(tool_call_id, receipt_id)]


def index_rows(conn: sa.Connection, tenant: str, first: int, last: int | None) -> IndexRows:
    """The chain's index rows of seqs first..last (last None: to the end)."""
    c, lk = CallRow.__table__.c, LinkRow.__table__.c
    calls: dict[int, set[tuple[str, str]]] = {}
    links: dict[int, list[tuple[str, str | None]]] = {}
    stmt = sa.select(c.seq, c.call_id, c.tool_name).where(c.chain == tenant, c.seq >= first)
    for seq, call_id, name in conn.execute(stmt if last is None else stmt.where(c.seq <= last)):
        calls.setdefault(seq, set()).add((call_id, name))
    stmt = sa.select(lk.seq, lk.tool_call_id, lk.receipt_id).where(
        lk.chain == tenant, lk.seq >= first
    )
    stmt = stmt if last is None else stmt.where(lk.seq <= last)
    for seq, call_id, receipt_id in conn.execute(stmt.order_by(lk.seq, lk.position)):
        links.setdefault(seq, []).append((call_id, receipt_id))
    return IndexRows(calls, links)


def merkle_nodes_ending(
    conn: sa.Connection, tenant: str, first_size: int, last_size: int
) -> dict[tuple[int, int], bytes]:
    """The stored perfect subtrees (level >= 1) completed by leaves first_size..last_size,
    i.e. whose last leaf is one of those, keyed by (level, idx)."""
    m = MerkleNodeRow.__table__.c
    spans = []
    for level in range(1, last_size.bit_length()):
        low, high = -(-first_size >> level) - 1, (last_size >> level) - 1
        if low <= high:
            spans.append(sa.and_(m.level == level, m.idx.between(low, high)))
    if not spans:
        return {}
    rows = conn.execute(sa.select(m.level, m.idx, m.hash).where(m.chain == tenant, sa.or_(*spans)))
    return {(row.level, row.idx): bytes(row.hash) for row in rows}


def reach(conn: sa.Connection, tenant: str) -> int:
    """How far the chain reaches (0: no chain yet): its head row's seq, or a higher stored
    receipt's. Deleting a receipt moves neither, so a range check on this cannot hide one."""
    head = head_row(conn, tenant)
    return max(head.head_seq if head else 0, last_seq(conn, tenant))


def last_seq(conn: sa.Connection, tenant: str) -> int:
    """The highest seq stored for the chain (0 when none), whatever the head row says."""
    r = ReceiptRow.__table__.c
    return conn.scalar(sa.select(sa.func.max(r.seq)).where(r.chain == tenant)) or 0


def unsigned_chains(conn: sa.Connection, key_id: str) -> dict[str, int]:
    """Chain -> its latest checkpoint's time (ms), for the chains whose head ``key_id``
    signed and whose last receipts no checkpoint covers yet (a writer stopped first)."""
    c = ChainRow.__table__.c
    query = sa.select(c.chain, c.checkpoint_at).where(
        c.key_id == key_id, c.head_seq > c.checkpoint_size
    )
    return {chain: at for chain, at in conn.execute(query)}


def entry_hash(conn: sa.Connection, tenant: str, seq: int) -> str | None:
    r = ReceiptRow.__table__.c
    return conn.scalar(sa.select(r.entry_hash).where(r.chain == tenant, r.seq == seq))


def seq_range(
    conn: sa.Connection, tenant: str, since: str | None, until: str | None
) -> tuple[int, int] | None:
    """First and last seq of the chain's receipts created in [since, until), or None."""
    r = ReceiptRow.__table__.c
    stmt = sa.select(sa.func.min(r.seq), sa.func.max(r.seq)).where(r.chain == tenant)
    if since is not None:
        stmt = stmt.where(r.created_at >= since)
    if until is not None:
        stmt = stmt.where(r.created_at < until)
    first, last = conn.execute(stmt).one()
    return None if first is None else (first, last)


def chunks(items: list[Any], size: int = 400) -> Iterator[list[Any]]:
    """``items`` in consecutive slices of at most ``size``: one IN list per query, so a
    query binds a bounded number of parameters however many items there are."""
    for i in range(0, len(items), size):
        yield items[i : i + size]
