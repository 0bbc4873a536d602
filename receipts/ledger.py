"""The Ledger: durable, serialised, group-committed appends to per-tenant receipt chains,
signed checkpoints, and the audit reads, proofs, verification and export built on them.

Write path (why it looks like this):

- One writer thread per Ledger drains a queue. Appends that arrive while a transaction is
  running wait for the next one and then share it (group commit): one lock, one batch of
  INSERTs and one fsync for all of them. ``append`` returns only after that commit, so a
  returned receipt is durable.
- Inside the transaction the chain's head row is locked (Postgres ``SELECT ... FOR UPDATE``;
  SQLite ``BEGIN IMMEDIATE``) and re-read, and only then are the drafts sealed onto it. Any
  number of writer processes or gateway replicas can share one database without forking a
  chain.
- Once the writer has committed to a chain it keeps that head and seals the next batch onto
  it without the locking read: the head's UPDATE, sent first, takes the lock, and if another
  writer extended the chain meanwhile, the receipt at the next seq is already there, so the
  insert fails on the primary key and the batch is redone under the lock. A chain where that
  happened is shared with another writer and is locked up front from then on. This saves a
  round trip per batch for the usual case of one writer per chain.
- The head row also carries the Merkle tree's right edge (``frontier``), so a batch extends
  the tree, stores the completed subtree hashes (``merkle_nodes``) and signs checkpoints
  without reading any earlier receipt.
- Any database failure fails every append of the batch with LedgerUnavailable and rolls the
  transaction back; nothing is half-written. The writer keeps one connection between
  batches, pings it after an idle spell or when the server has closed it meanwhile, and
  replaces it after a failure, so the ledger recovers by itself when the database returns.
  A restart while appends are flowing fails the batch in flight (503 to its callers, which
  the OpenAI SDK retries); the batch is never redone by itself, since its COMMIT may have
  landed and a redo would append it twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import queue
import select
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Self

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from receipts import queries
from receipts.append_sql import AppendSQL
from receipts.bundle import write_bundle
from receipts.canonical import canonical_json, sorted_json
from receipts.chain import VerificationReport, verify_receipts
from receipts.checkpoint import checkpoint_problem, make_checkpoint
from receipts.errors import ChainDamaged, LedgerUnavailable, ReceiptFormatError, ReceiptsError
from receipts.merkle import (
    CompactRange,
    compact_range,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
)
from receipts.queries import ReceiptPage, ReceiptQuery, rfc3339
from receipts.record import (
    GENESIS_PREV_HASH,
    PAYLOAD_MEMBERS,
    Receipt,
    ReceiptDraft,
    utc_now,
)
from receipts.seal import seal
from receipts.signing import KeyRing, Signer
from receipts.store import (
    CallRow,
    ChainRow,
    CheckpointRow,
    KeyRangeRow,
    LinkRow,
    MerkleNodeRow,
    ReceiptRow,
    SchemaRow,
    SigningKeyRow,
    create_engine,
    insert_ignore,
)

__all__ = ["Ledger", "ReceiptPage", "ReceiptQuery"]

log = logging.getLogger(__name__)

_STOP = object()
_IDLE_PING_S = 1.0  # the writer pings its connection before using it after this long idle


@dataclass(eq=False)
class _Pending:
    draft: ReceiptDraft
    future: Future[Receipt]


@dataclass
class _Head:
    """A chain's locked head row, advanced in memory while a batch is sealed onto it."""

    chain: str
    seq: int
    hash: str
    frontier: list[bytes]
    """Roots of the perfect subtrees of the Merkle tree at ``seq`` (a compact range)."""
    key_id: str | None
    checkpoint_size: int
    checkpoint_at: int  # epoch milliseconds of the chain's last checkpoint
    new_nodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stale_checkpoint: bool = False
    """The checkpoint columns come from the writer's own last commit, not a locked read:
    another process may have signed a checkpoint since, so they are not written back."""

    def kept(self) -> _Head:
        """A copy to seal the writer's next batch onto without re-reading the row."""
        return dataclasses.replace(
            self, frontier=list(self.frontier), new_nodes=[], stale_checkpoint=True
        )

    def add_leaf(self, entry_hash: str) -> None:
        """Extend the tree by one leaf, recording each perfect subtree the leaf completes
        (merkle_nodes rows) as it merges into the frontier."""
        self.frontier.append(leaf_hash(bytes.fromhex(entry_hash)))
        level, done = 0, self.seq + 1  # done: leaves covered at the current level
        while done % 2 == 0:
            right = self.frontier.pop()
            self.frontier[-1] = node_hash(self.frontier[-1], right)
            level, done = level + 1, done // 2
            self.new_nodes.append(
                {"chain": self.chain, "level": level, "idx": done - 1, "hash": self.frontier[-1]}
            )
        self.seq += 1
        self.hash = entry_hash

    def root(self) -> str:
        return CompactRange(self.seq, self.frontier).root().hex()

    def row(self) -> dict[str, Any]:
        """The chains row (or, with a stale checkpoint, the part of it) to record."""
        row = {
            "chain": self.chain,
            "head_seq": self.seq,
            "head_hash": self.hash,
            "frontier": ",".join(h.hex() for h in self.frontier),
            "key_id": self.key_id,
        }
        if not self.stale_checkpoint:
            row["checkpoint_size"] = self.checkpoint_size
            row["checkpoint_at"] = self.checkpoint_at
        return row


class Ledger:
    """Receipt chains in one database (Postgres or SQLite). Thread-safe; one per process.

    ``signer`` may be None for a read-only ledger (audit queries, verification, and export of
    receipts that stored checkpoints already cover).
    """

    def __init__(
        self,
        url: str,
        signer: Signer | None,
        *,
        checkpoint_every: int = 1000,
        checkpoint_interval_s: float = 60.0,
        retain_payloads: bool = False,
        max_batch: int = 500,
    ) -> None:
        if checkpoint_every < 1 or checkpoint_interval_s <= 0 or max_batch < 1:
            raise ValueError("checkpoint_every, checkpoint_interval_s and max_batch must be > 0")
        self.url = url
        self.signer = signer
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self.retain_payloads = retain_payloads
        self.max_batch = max_batch
        self._reader = create_engine(url)
        self._writer = create_engine(url, writer=True)
        self._sql = AppendSQL(self._writer.dialect)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # The writer thread's own state:
        self._conn: sa.Connection | None = None
        self._conn_used_at = 0.0
        self._heads: dict[str, _Head] = {}  # as this writer last committed them
        self._shared: set[str] = set()  # chains another writer extends too: always locked
        self._known_schemas: set[str] = set()
        self._key_registered = False
        self._uncheckpointed: dict[str, float] = {}  # chain -> when its checkpoint is due
        self._closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, url: str, signer: Signer | None, **options: Any) -> Ledger:
        """Connect to a database migrated by ``migrations.runner.upgrade`` (creates nothing).
        ``options`` are the keyword arguments of the constructor."""
        return cls(url, signer, **options)

    def close(self) -> None:
        """Commit what is queued, stop the writer thread and release the connections."""
        with self._lock:
            self._closed = True
            thread = self._thread
        try:
            if thread is not None:
                self._queue.put(_STOP)
                thread.join()
                self._checkpoint_quiet_chains(closing=True)
        finally:
            self._drop_connection()
            self._reader.dispose()
            self._writer.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self) -> None:
        """Raise LedgerUnavailable unless the database answers."""
        with self._reading() as conn:
            conn.execute(sa.text("SELECT 1"))

    # ------------------------------------------------------------------ appends

    def append(self, draft: ReceiptDraft) -> Receipt:
        """Seal ``draft`` onto its tenant's chain; returns once the receipt is committed.

        Raises LedgerUnavailable when the database cannot commit (fail closed), and
        ReceiptFormatError for a draft the chain refuses (a call id it already recorded).
        """
        return self.submit(draft).result()

    async def append_async(self, draft: ReceiptDraft) -> Receipt:
        """``append`` for asyncio callers: the event loop never waits on the commit."""
        return await asyncio.wrap_future(self.submit(draft))

    def submit(self, draft: ReceiptDraft) -> Future[Receipt]:
        """Queue ``draft`` for the next group commit; the future resolves after the commit."""
        if not isinstance(draft, ReceiptDraft):
            raise ReceiptFormatError(f"append takes a ReceiptDraft, not {type(draft).__name__}")
        if not self.retain_payloads and not draft.request.keys().isdisjoint(PAYLOAD_MEMBERS):
            request = {k: v for k, v in draft.request.items() if k not in PAYLOAD_MEMBERS}
            draft = dataclasses.replace(draft, request=request)
        future: Future[Receipt] = Future()
        with self._lock:
            if self.signer is None:
                raise ReceiptsError("this ledger was opened without a signer: it cannot append")
            if self._closed:
                raise ReceiptsError("the ledger is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
                self._thread.start()
            self._queue.put(_Pending(draft, future))
        return future

    def _run(self) -> None:
        """The writer thread: take whatever is queued (up to max_batch), commit it as one;
        once a tick, busy or not, sign the checkpoints that fell due by time."""
        tick = min(1.0, self.checkpoint_interval_s)
        next_tick = time.monotonic() + tick
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                item = None
            batch: list[_Pending] = []
            while item is not None and item is not _STOP:
                # Running from here on, so it can no longer be cancelled (a cancelled
                # future would refuse its result and kill this thread); one cancelled
                # before it was taken is dropped: nobody waits for it.
                if item.future.set_running_or_notify_cancel():
                    batch.append(item)
                if len(batch) >= self.max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            if batch:
                self._commit(batch)
            if item is _STOP:
                return
            if time.monotonic() >= next_tick:  # not only when idle: other chains may be busy
                self._checkpoint_quiet_chains()
                next_tick = time.monotonic() + tick

    def _commit(self, batch: list[_Pending]) -> None:
        chains = {pending.draft.tenant for pending in batch}
        kept = chains <= self._heads.keys() and chains.isdisjoint(self._shared)
        try:
            conn = self._connection()
            try:
                with conn.begin():
                    outcomes, heads, schemas = self._append_batch(conn, batch, kept=kept)
            except (IntegrityError, self._sql.integrity_errors):
                # Another writer extended a kept head (its receipt holds the next seq), or a
                # call id the chain already holds (rare: ids are random, so that check is
                # skipped on the first try). Redo under the lock, refusing those drafts alone.
                with conn.begin():
                    outcomes, heads, schemas = self._append_batch(conn, batch, check_calls=True)
        except (SQLAlchemyError, self._sql.dbapi_errors) as exc:
            log.warning("ledger commit failed, %d appends refused: %s", len(batch), _short(exc))
            self._fail(
                batch, LedgerUnavailable(f"the ledger database could not commit: {_short(exc)}")
            )
            return
        except Exception as exc:  # whatever broke: fail closed and go on
            log.exception("ledger batch failed")
            self._fail(
                batch,
                exc
                if isinstance(exc, ReceiptsError)
                else LedgerUnavailable(f"the ledger could not append: {type(exc).__name__}: {exc}"),
            )
            return
        self._key_registered = True
        self._known_schemas.update(schemas)
        for head in heads:
            self._note_committed(head)
        for pending, outcome in outcomes:
            if isinstance(outcome, Exception):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)

    def _note_committed(self, head: _Head) -> None:
        """Keep ``head`` for the next batch and schedule its timer checkpoint. The due time
        a locked read gives replaces the scheduled one; a kept head's stale checkpoint
        columns (early, at worst) only schedule a chain that had none."""
        if head.checkpoint_size >= head.seq:
            self._uncheckpointed.pop(head.chain, None)
        elif not head.stale_checkpoint or head.chain not in self._uncheckpointed:
            due = head.checkpoint_at / 1000 + self.checkpoint_interval_s
            self._uncheckpointed[head.chain] = due
        self._heads[head.chain] = head.kept()

    def _fail(self, batch: list[_Pending], error: Exception) -> None:
        """Refuse the whole batch. Whether its transaction committed may be unknown (the
        connection broke during COMMIT), so the kept heads and the connection go too."""
        self._heads.clear()
        self._drop_connection()
        for pending in batch:
            pending.future.set_exception(error)

    def _connection(self) -> sa.Connection:
        """The writer's connection, held between batches: a pool checkout with its pre-ping
        costs more than a whole append with a kept head. It is pinged first after an idle
        spell, or at once when the server has spoken on it unasked, so a database that
        restarted or cut its sessions meanwhile costs no failed append."""
        now = time.monotonic()
        if self._conn is not None and (
            now - self._conn_used_at > _IDLE_PING_S
            or _server_spoke(self._conn.connection.dbapi_connection, self._sql.dbapi_errors)
        ):
            try:
                self._writer.dialect.do_ping(self._conn.connection.dbapi_connection)
            except self._sql.dbapi_errors:
                self._drop_connection()
        if self._conn is None:
            self._conn = self._writer.connect()
        self._conn_used_at = now
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # do not hand a possibly broken connection back to the pool
            except (SQLAlchemyError, self._sql.dbapi_errors):
                pass
            conn.close()

    def _append_batch(
        self,
        conn: sa.Connection,
        batch: list[_Pending],
        *,
        kept: bool = False,
        check_calls: bool = False,
    ) -> tuple[list[tuple[_Pending, Receipt | Exception]], list[_Head], set[str]]:
        """Inside one transaction: lock each chain (or take its kept head), seal its drafts,
        write every row."""
        by_chain: dict[str, list[_Pending]] = {}
        for pending in batch:
            by_chain.setdefault(pending.draft.tenant, []).append(pending)
        if not self._key_registered:
            _insert_ignore(
                conn,
                SigningKeyRow,
                [
                    {
                        "key_id": self.signer.key_id,
                        "public_key_pem": self.signer.public_key_pem(),
                        "created_at": utc_now(),
                    }
                ],
            )
        rows: dict[type, list[dict[str, Any]]] = {
            SchemaRow: [],
            ReceiptRow: [],
            CallRow: [],
            LinkRow: [],
            MerkleNodeRow: [],
            KeyRangeRow: [],
            CheckpointRow: [],
        }  # inserted in this order (a receipt's calls and links after it)
        outcomes: list[tuple[_Pending, Receipt | Exception]] = []
        schemas: set[str] = set()
        heads = []
        for chain in sorted(by_chain):  # one lock order in every process: no deadlock
            if kept:
                head = self._heads[chain].kept()
            else:
                head = self._lock_head(conn, chain)
                known = self._heads.get(chain)
                if known is not None and known.seq != head.seq:
                    self._shared.add(chain)  # another writer extends it too: lock up front
            refused = _refuse_duplicate_calls(conn, chain, by_chain[chain]) if check_calls else {}
            first_seq = head.seq + 1
            for pending in by_chain[chain]:
                if pending in refused:
                    outcomes.append((pending, refused[pending]))
                    continue
                try:
                    receipt = seal(
                        pending.draft, seq=head.seq + 1, prev_hash=head.hash, signer=self.signer
                    )
                except ReceiptFormatError as exc:  # e.g. a NaN in tool arguments: this one only
                    outcomes.append((pending, exc))
                    continue
                head.add_leaf(receipt.entry_hash)
                _add_receipt_rows(receipt, rows)
                bound = receipt.manifest["schema_hash"]
                if bound is not None and bound not in self._known_schemas and bound not in schemas:
                    schemas.add(bound)
                    rows[SchemaRow].append(
                        {"hash": bound, "body": canonical_json(pending.draft.schema).decode()}
                    )
                outcomes.append((pending, receipt))
            if head.seq < first_seq:
                continue  # nothing sealed: leave the row alone (a kept head may be stale)
            if head.key_id != self.signer.key_id:
                rows[KeyRangeRow].append(
                    {"chain": chain, "first_seq": first_seq, "key_id": self.signer.key_id}
                )
                head.key_id = self.signer.key_id
            rows[MerkleNodeRow].extend(head.new_nodes)
            if self._checkpoint_due(head):
                rows[CheckpointRow].append(_checkpoint_row(self._sign_checkpoint(head)))
            heads.append(head)
        tables = {table.__table__: values for table, values in rows.items()}
        with closing(_cursor(conn)) as cursor:  # nothing may follow: this commits
            self._sql.write_and_commit(cursor, tables, [head.row() for head in heads])
        return outcomes, heads, schemas

    def _lock_head(self, conn: sa.Connection, chain: str) -> _Head:
        """Lock the chain's head row (creating the chain on its first append) and read it."""
        with closing(_cursor(conn)) as cursor:
            row = self._sql.lock_head(cursor, chain)
            if row is None:
                _insert_ignore(
                    conn,
                    ChainRow,
                    [
                        {
                            "chain": chain,
                            "head_seq": 0,
                            "head_hash": GENESIS_PREV_HASH,
                            "frontier": "",
                            "key_id": None,
                            "checkpoint_size": 0,
                            "checkpoint_at": 0,
                        }
                    ],
                )
                row = self._sql.lock_head(cursor, chain)
        if row is None:  # inserted above (or by a concurrent writer) and never deleted
            raise LedgerUnavailable(f"chain {chain!r} has no head row after creating it")
        if row["head_seq"] < row["checkpoint_size"]:
            raise LedgerUnavailable(
                f"chain {chain!r} is behind its own checkpoint (head {row['head_seq']}, signed"
                f" {row['checkpoint_size']}): receipts were removed; refusing to extend or sign it"
            )
        return _Head(
            chain,
            row["head_seq"],
            row["head_hash"],
            [bytes.fromhex(h) for h in row["frontier"].split(",") if h],
            row["key_id"],
            row["checkpoint_size"],
            row["checkpoint_at"],
        )

    def _save_checkpoint_and_commit(self, conn: sa.Connection, head: _Head) -> dict[str, Any]:
        checkpoint = self._sign_checkpoint(head)
        with closing(_cursor(conn)) as cursor:
            self._sql.write_and_commit(
                cursor, {CheckpointRow.__table__: [_checkpoint_row(checkpoint)]}, [head.row()]
            )
        return checkpoint

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_due(self, head: _Head) -> bool:
        """Every ``checkpoint_every`` receipts, or ``checkpoint_interval_s`` after the last."""
        return head.seq > head.checkpoint_size and (
            head.seq - head.checkpoint_size >= self.checkpoint_every
            or time.time() - head.checkpoint_at / 1000 >= self.checkpoint_interval_s
        )

    def _sign_checkpoint(self, head: _Head) -> dict[str, Any]:
        """A signed checkpoint at ``head``, which records it as its latest."""
        checkpoint = make_checkpoint(head.chain, head.seq, head.root(), self.signer)
        head.checkpoint_size, head.checkpoint_at = head.seq, int(time.time() * 1000)
        head.stale_checkpoint = False  # the newest: this writer just signed it
        return checkpoint

    def checkpoint_now(self, tenant: str) -> dict[str, Any]:
        """A signed checkpoint at the chain's head: the stored one if it is current."""
        if self.signer is None:
            raise ReceiptsError("this ledger was opened without a signer: it cannot sign")
        with self._writing() as conn:
            head = self._lock_head(conn, tenant)
            if head.seq == 0:
                raise ReceiptFormatError(f"chain {tenant!r} has no receipts to checkpoint")
            latest = queries.latest_checkpoint(conn, tenant)
            if latest is not None and latest["tree_size"] > head.seq:
                raise LedgerUnavailable(
                    f"chain {tenant!r} is behind its own checkpoint (head {head.seq}, signed"
                    f" {latest['tree_size']}): receipts were removed; refusing to sign it"
                )
            if latest is not None and latest["tree_size"] == head.seq:
                return latest
            return self._save_checkpoint_and_commit(conn, head)

    def _checkpoint_quiet_chains(self, *, closing: bool = False) -> None:
        """The timer half of "every N receipts or T seconds", for chains that went quiet;
        on close, every chain this ledger extended, so its last receipts are covered."""
        now = time.time()
        for chain, due in list(self._uncheckpointed.items()):
            if due > now and not closing:
                continue
            try:
                conn = self._connection()
                with conn.begin():
                    head = self._lock_head(conn, chain)
                    if self._checkpoint_due(head) or (closing and head.seq > head.checkpoint_size):
                        self._save_checkpoint_and_commit(conn, head)
                self._note_committed(head)
            except (SQLAlchemyError, self._sql.dbapi_errors, ReceiptsError) as exc:  # next tick
                log.warning("checkpoint of chain %r failed: %s", chain, _short(exc))
                self._drop_connection()

    # ------------------------------------------------------------------ reads

    def _reading(self) -> AbstractContextManager[sa.Connection]:
        return _transaction(self._reader, "is unavailable")

    def _writing(self) -> AbstractContextManager[sa.Connection]:
        return _transaction(self._writer, "could not commit")

    def query(self, q: ReceiptQuery) -> ReceiptPage:
        with self._reading() as conn:
            return queries.query(conn, q)

    def get(self, tenant: str, receipt_id: str) -> Receipt | None:
        with self._reading() as conn:
            return queries.get(conn, tenant, receipt_id)

    def get_by_seq(self, tenant: str, seq: int) -> Receipt | None:
        with self._reading() as conn:
            return queries.get_by_seq(conn, tenant, seq)

    def find_call(self, tenant: str, call_id: str) -> Receipt | None:
        with self._reading() as conn:
            return queries.find_call(conn, tenant, call_id)

    def answers_to(self, tenant: str, call_id: str) -> list[Receipt]:
        with self._reading() as conn:
            return queries.answers_to(conn, tenant, call_id)

    def schema(self, schema_hash: str) -> dict[str, Any] | None:
        with self._reading() as conn:
            return queries.schema(conn, schema_hash)

    def public_keys(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """Registered keys with the seq ranges each signed (``KeyRing.from_public_keys``)."""
        with self._reading() as conn:
            return queries.public_keys(conn, tenant)

    def last_seq(self, tenant: str) -> int:
        """How far the chain reaches (0: no chain yet): its head row's seq, or a higher stored
        receipt's. Deleting a receipt moves neither, so a range check on this cannot hide one."""
        with self._reading() as conn:
            head = queries.chain_head(conn, tenant)
            return max(head.head_seq if head else 0, queries.last_seq(conn, tenant))

    def latest_checkpoint(self, tenant: str) -> dict[str, Any] | None:
        with self._reading() as conn:
            return queries.latest_checkpoint(conn, tenant)

    def chains(self) -> list[str]:
        with self._reading() as conn:
            return queries.chains(conn)

    # ------------------------------------------------------------------ proofs

    def inclusion_proof(
        self, tenant: str, seq: int, tree_size: int | None = None
    ) -> dict[str, Any]:
        """RFC 9162 inclusion proof of receipt ``seq`` in the tree of ``tree_size`` leaves
        (default: the latest checkpoint, which is included so the root is signed)."""
        with self._reading() as conn:
            checkpoint, tree_size = self._proof_target(conn, tenant, tree_size)
            if not 1 <= seq <= tree_size:
                raise ReceiptFormatError(f"seq {seq} is outside the tree of size {tree_size}")
            proof, root = queries.with_stored_tree(
                conn,
                tenant,
                lambda subtree: (
                    inclusion_proof(seq - 1, tree_size, subtree),
                    subtree(0, tree_size),
                ),
            )
            leaf = queries.entry_hash(conn, tenant, seq)
        return {
            "chain": tenant,
            "seq": seq,
            "leaf_index": seq - 1,
            "tree_size": tree_size,
            "entry_hash": leaf,
            "proof": [h.hex() for h in proof],
            "root_hash": root.hex(),
            "checkpoint": checkpoint,
        }

    def consistency_proof(
        self, tenant: str, size1: int, size2: int | None = None
    ) -> dict[str, Any]:
        """RFC 9162 consistency proof that the tree of ``size1`` leaves is a prefix of the
        tree of ``size2`` (default: the latest checkpoint's size)."""
        with self._reading() as conn:
            checkpoint, size2 = self._proof_target(conn, tenant, size2)
            if not 1 <= size1 <= size2:
                raise ReceiptFormatError(f"need 1 <= size1 <= size2, got {size1} and {size2}")
            proof, root1, root2 = queries.with_stored_tree(
                conn,
                tenant,
                lambda subtree: (
                    consistency_proof(size1, size2, subtree),
                    subtree(0, size1),
                    subtree(0, size2),
                ),
            )
        return {
            "chain": tenant,
            "size1": size1,
            "size2": size2,
            "root1": root1.hex(),
            "root2": root2.hex(),
            "proof": [h.hex() for h in proof],
            "checkpoint": checkpoint,
        }

    def _proof_target(
        self, conn: sa.Connection, tenant: str, tree_size: int | None
    ) -> tuple[dict[str, Any] | None, int]:
        """The tree size a proof is made against (default: the latest checkpoint's, else
        the head) and the signed checkpoint at that size, if one was stored."""
        if tree_size is None:
            checkpoint = queries.latest_checkpoint(conn, tenant)
            if checkpoint is not None:
                return checkpoint, checkpoint["tree_size"]
        head = queries.chain_head(conn, tenant)
        head_seq = head.head_seq if head else 0
        size = head_seq if tree_size is None else tree_size
        if head_seq == 0:
            raise ReceiptFormatError(f"chain {tenant!r} has no receipts yet: nothing to prove")
        if not 1 <= size <= head_seq:
            raise ReceiptFormatError(
                f"tree size {size} is outside chain {tenant!r} (1..{head_seq})"
            )
        return queries.checkpoint_at(conn, tenant, size), size

    # ------------------------------------------------------------------ verification

    def verify(
        self,
        tenant: str,
        from_seq: int | None = None,
        to_seq: int | None = None,
        *,
        checkpoint: Mapping[str, Any] | None = None,
        keyring: KeyRing | None = None,
    ) -> VerificationReport:
        """Verify the chain (or seqs ``from_seq..to_seq``) as stored, naming the first
        failing seq.

        Streams the rows through receipts.chain.verify_receipts (hashes, signatures, links,
        schema binding, Merkle root against a signed checkpoint) and also checks what only
        the database can get wrong: indexed columns that disagree with the signed body, every
        stored checkpoint in the range (signature and root), rows beyond or missing before
        the chain's head. ``checkpoint`` is one the auditor saved
        (default: the stored one); ``keyring`` pins trusted keys (default: the keys the
        database lists, which an attacker with write access could extend).
        """
        with self._reading() as conn:
            head = queries.chain_head(conn, tenant)
            head_seq = head.head_seq if head else 0
            last = queries.last_seq(conn, tenant)
            start = from_seq or 1
            end = to_seq if to_seq is not None else max(head_seq, last)
            if start < 1 or end < start - 1:
                raise ReceiptFormatError(f"bad seq range {start}..{end}")
            pinned = keyring is not None
            keyring = keyring or KeyRing.from_public_keys(queries.public_keys(conn, tenant))
            checkpoint = checkpoint or self._covering_checkpoint(conn, tenant, start, to_seq)
            try:
                left, right = self._range_context(conn, tenant, start, end, checkpoint, to_seq)
            except ChainDamaged as exc:  # what verification is for: a report, not an error
                return VerificationReport.failed(str(exc), chain=tenant)
            prev = GENESIS_PREV_HASH if start == 1 else queries.entry_hash(conn, tenant, start - 1)
            if prev is None:
                return VerificationReport.failed(
                    "receipt missing from the database", seq=start - 1, chain=tenant
                )
            rows = _CheckedRows(
                queries.stream_rows(conn, tenant, start, end),
                CompactRange(start - 1, left or []),
                queries.checkpoints(conn, tenant, start, end),
                keyring,
            )
            schema_cache: dict[str, dict[str, Any] | None] = {}
            report = verify_receipts(
                rows,
                keyring,
                expected_prev_hash=prev,
                start_seq=start,
                checkpoint=checkpoint,
                schemas=lambda h: schema_cache.setdefault(h, queries.schema(conn, h)),
                left=left,
                right=right,
            )
        problems = [rows.problem] if rows.problem else []
        if not report.ok:
            problems.append((report.first_failure_seq, report.reason))
        if to_seq is None and last > head_seq:
            problems.append((head_seq + 1, f"receipt stored beyond the chain head ({head_seq})"))
        if to_seq is None and rows.seen < end - start + 1 and report.ok:
            missing = f"receipt missing: the stored receipts end before the chain head ({head_seq})"
            problems.append((start + rows.seen, missing))
        if not problems:
            return dataclasses.replace(report, notes=(_trust_note(keyring, pinned),))
        seq, reason = min(problems, key=lambda p: float("inf") if p[0] is None else p[0])
        return VerificationReport.failed(reason, seq=seq, checked=report.checked, chain=tenant)

    def _covering_checkpoint(
        self, conn: sa.Connection, tenant: str, start: int, to_seq: int | None
    ) -> dict[str, Any] | None:
        """The stored checkpoint a verification checks the Merkle root against: the latest
        (so a truncated tail shows), or for a range the first one at or after its end."""
        if to_seq is None:
            return queries.latest_checkpoint(conn, tenant)
        checkpoint = queries.checkpoint_at_least(conn, tenant, to_seq)
        if checkpoint is None:
            checkpoint = queries.latest_checkpoint(conn, tenant, max_size=to_seq)
        return checkpoint if checkpoint and checkpoint["tree_size"] >= start - 1 else None

    def _range_context(
        self,
        conn: sa.Connection,
        tenant: str,
        start: int,
        end: int,
        checkpoint: Mapping[str, Any] | None,
        to_seq: int | None,
    ) -> tuple[list[bytes] | None, list[bytes] | None]:
        """Compact ranges left of ``start`` and right of ``end`` up to the checkpoint, so a
        slice of the chain can be checked against the root of the whole tree."""
        size = checkpoint["tree_size"] if checkpoint else 0
        want_right = to_seq is not None and size > end
        if start == 1 and not want_right:
            return None, None
        return queries.with_stored_tree(
            conn,
            tenant,
            lambda subtree: (
                compact_range(0, start - 1, subtree),
                compact_range(end, size, subtree) if want_right else None,
            ),
        )

    # ------------------------------------------------------------------ export

    def export(
        self,
        tenant: str,
        out: str | Path | IO[bytes],
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> None:
        """Write the bundle of the tenant's receipts created in [since, until) to ``out``.

        Open-ended (no ``until``), the bundle runs to a signed checkpoint of the whole chain:
        one signed now at the head when this ledger has a signer, else the latest stored. Any
        receipt missing below that checkpoint then shows as a truncation in the bundle. With
        ``until``, it ends at the last receipt in the range and carries the compact range
        that ties it to a later checkpoint's root; a range not starting at seq 1 carries the
        previous entry hash and the compact range to its left.
        """
        with self._reading() as conn:
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
            raise ReceiptFormatError(f"chain {tenant!r} has no receipts {where}")
        first, last = span
        checkpoint = (
            self.checkpoint_now(tenant)
            if self.signer is not None and (until is None or stored is None)
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
        with self._reading() as conn:
            prev = GENESIS_PREV_HASH if first == 1 else queries.entry_hash(conn, tenant, first - 1)
            if prev is None:
                raise ChainDamaged(
                    f"receipt seq {first - 1} of chain {tenant!r} is missing:"
                    " the range cannot be tied to the chain"
                )
            left, right = queries.with_stored_tree(
                conn,
                tenant,
                lambda subtree: (
                    compact_range(0, first - 1, subtree),
                    compact_range(last, checkpoint["tree_size"], subtree),
                ),
            )
            schemas = queries.schemas(conn, queries.schema_hashes(conn, tenant, first, last))
            receipts = _consecutive(queries.stream_rows(conn, tenant, first, last), first)
            write_bundle(
                out,
                receipts,
                schemas,
                queries.public_keys(conn, tenant),
                checkpoint,
                prev_entry_hash=prev,
                proofs={"left": [h.hex() for h in left], "right": [h.hex() for h in right]},
            )


@contextmanager
def _transaction(engine: sa.Engine, failing: str) -> Iterator[sa.Connection]:
    """A transaction whose database failures surface as LedgerUnavailable (fail closed)."""
    try:
        with engine.begin() as conn:
            yield conn
    except (SQLAlchemyError, engine.dialect.loaded_dbapi.Error) as exc:  # driver: append_sql
        raise LedgerUnavailable(f"the ledger database {failing}: {_short(exc)}") from exc


def _consecutive(rows: Iterator[sa.Row], first: int) -> Iterator[dict[str, Any]]:
    """Receipt objects for a bundle, ending before the first gap or out-of-order row.

    A bundle holds consecutive receipts; a database that lost or reordered rows yields the
    verifiable prefix, and the offline verifier then names the first missing seq (the
    checkpoint covers more than the bundle holds)."""
    expected = first
    for row in rows:
        obj = json.loads(row.body)
        if row.seq != expected or not isinstance(obj, dict) or obj.get("seq") != expected:
            log.warning("export stops before seq %d: the stored chain is broken there", expected)
            return
        yield obj
        expected += 1


class _CheckedRows:
    """Receipt rows -> JSON objects for the chain verifier, stopping at the first row whose
    indexed columns disagree with its signed body (a query could be steered by such a row)
    or that completes a tree whose stored checkpoint is forged or does not match."""

    COLUMNS = (
        "id",
        "chain",
        "seq",
        "created_at",
        "tenant",
        "key_id",
        "manifest_hash",
        "prev_hash",
        "entry_hash",
        "finish_reason",
    )

    def __init__(
        self,
        rows: Iterator[sa.Row],
        tree: CompactRange,
        checkpoints: Mapping[int, Mapping[str, Any]],
        keyring: KeyRing,
    ) -> None:
        self._rows = rows
        self._tree = tree  # over the entry hashes read so far, for the stored checkpoints
        self._checkpoints = checkpoints
        self._keyring = keyring
        self.seen = 0
        self.problem: tuple[int, str] | None = None

    def __iter__(self) -> Iterator[dict[str, Any] | str]:
        for row in self._rows:
            try:
                obj = json.loads(row.body)
            except ValueError:
                self.problem = (row.seq, "stored receipt body is not JSON")
                return
            mismatch = self._mismatch(row, obj) if isinstance(obj, dict) else "body"
            if mismatch:
                self.problem = (
                    row.seq,
                    f"row column {mismatch!r} disagrees with the signed receipt body",
                )
                return
            self.seen += 1
            yield obj
            self._tree.append(leaf_hash(bytes.fromhex(row.entry_hash)))
            stored = self._checkpoints.get(self._tree.size)
            if stored is not None and (reason := self._checkpoint_problem(stored)):
                self.problem = (row.seq, reason)
                return

    def _checkpoint_problem(self, stored: Mapping[str, Any]) -> str | None:
        reason = checkpoint_problem(stored, self._keyring)
        if reason is None and stored["root_hash"] != self._tree.root().hex():
            reason = "Merkle root of the receipts does not match the stored checkpoint"
        return reason and f"stored checkpoint at tree size {self._tree.size}: {reason}"

    def _mismatch(self, row: sa.Row, obj: dict[str, Any]) -> str | None:
        for column in self.COLUMNS:
            if getattr(row, column) != obj.get(column):
                return column
        manifest = obj.get("manifest")
        output = obj.get("output")
        if not isinstance(manifest, dict) or not isinstance(output, dict):
            return None  # malformed bodies are the chain verifier's to name
        if (row.model, row.schema_hash) != (manifest.get("model"), manifest.get("schema_hash")):
            return "model" if row.model != manifest.get("model") else "schema_hash"
        return "output_kind" if row.output_kind != output.get("kind") else None


def receipt_text(receipt: Receipt) -> str:
    """The stored form of a receipt: its JSON with sorted keys, compact and lossless.

    Not re-canonicalized here (RFC 8785 costs a third of an append); every reader parses it
    and the verifier recomputes the entry hash over its RFC 8785 form, so any edit shows.
    """
    return sorted_json(receipt.to_json_obj()).decode()


def _add_receipt_rows(receipt: Receipt, rows: dict[type, list[dict[str, Any]]]) -> None:
    """The receipts row (canonical body + indexed copies) and its call and link index rows."""
    chain, seq = receipt.chain, receipt.seq
    rows[ReceiptRow].append(
        {
            "chain": chain,
            "seq": seq,
            "id": receipt.id,
            "created_at": receipt.created_at,
            "tenant": receipt.tenant,
            "key_id": receipt.key_id,
            "manifest_hash": receipt.manifest_hash,
            "schema_hash": receipt.manifest["schema_hash"],
            "model": receipt.manifest["model"],
            "output_kind": receipt.output["kind"],
            "finish_reason": receipt.finish_reason,
            "prev_hash": receipt.prev_hash,
            "entry_hash": receipt.entry_hash,
            "body": receipt_text(receipt),
        }
    )
    rows[CallRow].extend(
        {"chain": chain, "call_id": call["id"], "seq": seq, "tool_name": call["name"]}
        for call in receipt.tool_calls
    )
    rows[LinkRow].extend(
        {
            "chain": chain,
            "seq": seq,
            "position": i,
            "tool_call_id": link["tool_call_id"],
            "receipt_id": link["receipt_id"],
        }
        for i, link in enumerate(receipt.links)
    )


def _refuse_duplicate_calls(
    conn: sa.Connection, chain: str, batch: list[_Pending]
) -> dict[_Pending, Exception]:
    """Drafts whose call ids the chain already holds (or an earlier draft of the batch
    does): a call id names one call forever, so these appends fail alone."""
    ids = [call["id"] for p in batch for call in p.draft.output["tool_calls"]]
    if not ids:
        return {}
    c = CallRow.__table__.c
    taken: dict[str, int | None] = dict(
        conn.execute(
            sa.select(c.call_id, c.seq).where(c.chain == chain, c.call_id.in_(sorted(set(ids))))
        ).all()
    )
    refused: dict[_Pending, Exception] = {}
    for pending in batch:
        calls = [call["id"] for call in pending.draft.output["tool_calls"]]
        clash = [i for i in calls if i in taken] or [i for i in calls if calls.count(i) > 1]
        if clash:
            where = f" (seq {taken[clash[0]]})" if clash[0] in taken else ""
            refused[pending] = ReceiptFormatError(
                f"tool call id {clash[0]} is already recorded in chain {chain!r}{where}"
            )
        else:
            taken.update((i, None) for i in calls)
    return refused


def _checkpoint_row(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "chain": checkpoint["chain"],
        "tree_size": checkpoint["tree_size"],
        "root_hash": checkpoint["root_hash"],
        "timestamp": checkpoint["timestamp"],
        "key_id": checkpoint["key_id"],
        "body": canonical_json(checkpoint).decode(),
    }


def _server_spoke(dbapi_connection: Any, dbapi_errors: type[Exception]) -> bool:
    """Whether an idle client-server connection has something to read (no wait: one poll).

    Between transactions a server sends nothing unasked but the notice that it is ending the
    session (a restart, a failover, ``pg_terminate_backend``) before it closes the socket;
    so data or EOF here means the connection is gone. SQLite has no socket: never.
    """
    fileno = getattr(dbapi_connection, "fileno", None)
    if fileno is None:
        return False
    try:
        if not hasattr(select, "poll"):  # Windows: select() takes sockets, and any fd number
            return bool(select.select([fileno()], [], [], 0)[0])
        poller = select.poll()  # unlike select(), not limited to fd numbers below 1024
        poller.register(fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, dbapi_errors):  # closed or unusable: the ping that follows tells
        return True


def _cursor(conn: sa.Connection) -> Any:
    """A cursor of the driver's connection under `conn`, inside the same transaction."""
    return conn.connection.dbapi_connection.cursor()


def _insert_ignore(conn: sa.Connection, table: type, values: list[dict[str, Any]]) -> None:
    conn.execute(insert_ignore(table.__table__, conn.dialect), values)


def _short(exc: BaseException) -> str:
    """First line of a driver error: enough to diagnose, no SQL or parameters (no payloads)."""
    orig = getattr(exc, "orig", None) or exc
    return f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}"


def _trust_note(keyring: KeyRing, pinned: bool) -> str:
    """On whose authority a passing verification of the database stands."""
    ids = ", ".join(keyring.key_ids())
    if pinned:
        return f"trusted only the pinned key(s): {ids}"
    return (
        f"trusted the key(s) the database lists ({ids}): someone with write access to it"
        " could add one; pin the operator's key (callproof ledger verify --public-key) to"
        " rule that out"
    )
