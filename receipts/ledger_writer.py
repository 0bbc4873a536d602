"""The ledger's writer thread: durable, serialised, group-committed appends to per-tenant
receipt chains, and the signed checkpoints that fall due as they grow.

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
  it without the locking read: the head's UPDATE, sent first, takes the lock, and it is a
  compare-and-set on the head (seq, entry hash) the batch was sealed onto. If another writer
  extended the chain meanwhile (or it went back), the UPDATE fails on NOT NULL and the batch
  is redone under the lock. A chain where that happened is shared with another writer and is
  locked up front from then on. This saves a round trip per batch for the usual case of one
  writer per chain.
- A chain's head only grows. The writer remembers the highest head it saw on each chain; a
  head found below it (a database restored from a backup, a lagging standby promoted) lost
  receipts whose callers hold them, and the chain is neither extended nor signed again by
  this process (ChainBehind), since the same seqs would get a second signed history.
- The head row also carries the Merkle tree's right edge (``frontier``), so a batch extends
  the tree, stores the completed subtree hashes (``merkle_nodes``) and signs checkpoints
  without reading any earlier receipt.
- Any database failure fails every append of the batch with LedgerUnavailable and rolls the
  transaction back; nothing is half-written. The writer keeps one connection between
  batches, pings it after an idle spell or when the server has closed it meanwhile, and
  replaces it after a failure, so the ledger recovers by itself when the database returns.
  A restart while appends are flowing fails the batch in flight (503 to its callers, which
  the OpenAI SDK retries); the batch is never redone by itself, since its COMMIT may have
  landed and a redo would append it twice. When the connection broke after COMMIT went
  out, the writer asks the database which of the batch's receipts landed (at once, then
  every tick until it answers) and resolves each append accordingly.
- On start and every checkpoint interval, chains whose head this key sealed and no checkpoint
  covers (a writer of this key killed before signing them, a replica's included) are
  scheduled for their timer checkpoint.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from receipts import queries
from receipts.append_sql import AppendSQL
from receipts.canonical import canonical_json
from receipts.chain_head import ChainHead
from receipts.checkpoint import make_checkpoint
from receipts.errors import (
    ChainBehind,
    LedgerUnavailable,
    OutOfRange,
    ReceiptFormatError,
    ReceiptsError,
)
from receipts.ledger_file import LedgerFile
from receipts.merkle import CompactRange
from receipts.record import GENESIS_PREV_HASH, Receipt, ReceiptDraft
from receipts.seal import seal
from receipts.signing import Signer
from receipts.store import (
    CallRow,
    ChainRow,
    CheckpointRow,
    KeyRangeRow,
    LinkRow,
    MerkleNodeRow,
    ReceiptRow,
    SchemaRow,
    create_engine,
    insert_ignore,
    receipt_text,
    register_signing_key,
    short_error,
    transaction,
)
from receipts.writer_connection import WriterConnection, driver_cursor, link_broke

log = logging.getLogger("receipts.ledger")

_STOP = object()


@dataclass(eq=False)
class _Pending:
    draft: ReceiptDraft
    future: Future[Receipt]

    def claim(self) -> bool:
        """Whether someone still waits for this receipt, making it the writer's if so (which
        alone resolves it from then on); asking again gives the same answer. A draft stays
        cancellable (its caller's deadline) until the writer is about to seal it: on SQLite
        once it holds the write lock, on Postgres after the chain's locking read (a kept head
        has none). A caller that gave up before then is never sealed: its 503 has no receipt
        behind it."""
        future = self.future
        return future.running() or (not future.done() and future.set_running_or_notify_cancel())


def _no_rows() -> dict[type, list[dict[str, Any]]]:
    # inserted in this order (a receipt's calls and links after it)
    tables = (SchemaRow, ReceiptRow, CallRow, LinkRow, MerkleNodeRow, KeyRangeRow, CheckpointRow)
    return {table: [] for table in tables}


@dataclass
class _BatchWrite:
    """What one transaction writes, and what each of its drafts gets once it commits."""

    rows: dict[type, list[dict[str, Any]]] = field(default_factory=_no_rows)
    outcomes: list[tuple[_Pending, Receipt | Exception]] = field(default_factory=list)
    heads: list[ChainHead] = field(default_factory=list)
    schemas: set[str] = field(default_factory=set)  # the schema rows it adds
    committing: bool = False  # its COMMIT is on its way: a lost reply leaves it in doubt

    def sealed(self) -> list[tuple[_Pending, Receipt]]:
        return [(p, r) for p, r in self.outcomes if isinstance(r, Receipt)]


class LedgerWriter:
    """The one thread that appends to a database's chains for this process (Ledger's write
    half). Started by ``start`` or the first ``submit``; ``close`` commits what is queued
    and stops it."""

    def __init__(
        self,
        url: str,
        signer: Signer,
        *,
        checkpoint_every: int,
        checkpoint_interval_s: float,
        max_batch: int,
        file: LedgerFile | None = None,
    ) -> None:
        self.signer = signer
        self._file = file  # SQLite: checked before every use of the database
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self.max_batch = max_batch
        self._engine = create_engine(url, writer=True)
        self._sql = AppendSQL(self._engine.dialect)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # The writer thread's own state:
        self._heads: dict[str, ChainHead] = {}  # as this writer last committed them
        # a dropped connection drops the heads kept on it: whatever made it go may have
        # moved the chains back, and a kept head would seal past a gap no primary key notices
        self._link = WriterConnection(
            self._engine, self._sql.dbapi_errors, file, on_drop=self._heads.clear
        )
        # chain -> the highest head (seq, entry hash) seen committed on it, never dropped: a
        # head found below it, or at its seq with another hash, means the database went
        # back in time under this ledger
        self._high_water: dict[str, tuple[int, str]] = {}
        self._high_water_lock = threading.Lock()  # the writer and checkpoint_now's callers
        self._shared: set[str] = set()  # chains another writer extends too: always locked
        self._known_schemas: set[str] = set()
        self._key_registered = False
        self._uncheckpointed: dict[str, float] = {}  # chain -> when its checkpoint is due
        self._unsigned_scan_at = 0.0  # when to look for chains left unsigned next (monotonic)
        # receipts whose batch sent COMMIT and lost the reply, with the error they get if
        # it did not land: resolved once the database says which
        self._doubts: list[tuple[_Pending, Receipt, LedgerUnavailable]] = []
        self._busy_since: float | None = None  # when the transaction under way began
        self._closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the writer thread now rather than at the first append, so that chains a
        stopped writer left with unsigned receipts (a crash) get their timer checkpoint
        without waiting for the next receipt."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
            self._thread.start()

    def submit(self, draft: ReceiptDraft) -> Future[Receipt]:
        """Queue ``draft`` for the next group commit; the future resolves after the commit."""
        future: Future[Receipt] = Future()
        with self._lock:
            if self._closed:
                raise LedgerUnavailable("the ledger is closed: the gateway is shutting down")
            self.check_running()
            self._start()
            self._queue.put(_Pending(draft, future))
        return future

    def check_running(self) -> None:
        """Raise LedgerUnavailable if the writer thread has died (a BaseException its batch
        guard does not catch): every append would wait in its queue for nobody."""
        if self._thread is not None and not self._thread.is_alive() and not self._closed:
            raise LedgerUnavailable(
                "the ledger's writer thread has stopped (its error is in the log): restart the"
                " gateway"
            )

    def stalled_for(self) -> float:
        """Seconds the transaction under way has run (0 when idle): a commit that never
        ends (a synchronous standby gone, a full disk) shows here, not in a ping."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def queued(self) -> int:
        """Receipts in the queue, not counting the batch being committed (approximate, as
        any reading of a queue other threads fill)."""
        return self._queue.qsize()

    def close(self) -> None:
        """Commit what is queued, sign the last checkpoints, release the connection."""
        with self._lock:
            self._closed = True
            thread = self._thread
        try:
            if thread is not None:
                self._queue.put(_STOP)
                thread.join()
                self._checkpoint_quiet_chains(closing=True)
        finally:
            self._link.drop()
            self._engine.dispose()

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
                if not item.future.cancelled():  # nobody waits for it: dropped
                    batch.append(item)
                if len(batch) >= self.max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            if batch:
                try:
                    with self._busy():
                        self._commit(batch)
                except Exception as exc:  # a bug of its own: fail closed, keep the thread
                    log.exception("ledger writer failed a batch")
                    self._fail(batch, LedgerUnavailable(f"the ledger writer failed: {exc!r}"))
            if item is _STOP:
                self._settle_doubts(last_try=True)
                return
            if time.monotonic() >= next_tick:  # not only when idle: other chains may be busy
                try:
                    self._settle_doubts()
                    self._find_unsigned_chains()
                    self._checkpoint_quiet_chains()
                except Exception:  # a bug of its own: the next tick tries again
                    log.exception("ledger writer's tick failed")
                next_tick = time.monotonic() + tick

    @contextmanager
    def _busy(self) -> Iterator[None]:
        """Around each of the writer's transactions: what stalled_for measures (from the
        outermost, when one runs inside another's failure handling)."""
        prior = self._busy_since
        self._busy_since = time.monotonic() if prior is None else prior
        try:
            yield
        finally:
            self._busy_since = prior

    def _commit(self, batch: list[_Pending]) -> None:
        chains = {pending.draft.tenant for pending in batch}
        conn: sa.Connection | None = None
        write = _BatchWrite()
        try:
            conn = self._link.get()  # first: a replaced connection drops the kept heads
            kept = chains <= self._heads.keys() and chains.isdisjoint(self._shared)
            try:
                with conn.begin():
                    self._append_batch(conn, batch, write, kept=kept)
            except (IntegrityError, self._sql.integrity_errors):
                # A kept head's compare-and-set failed (another writer extended the chain, or
                # it went back), or a call id the chain already holds (rare: ids are random,
                # so that check is skipped on the first try). Redo under the lock, refusing
                # those drafts alone.
                write = _BatchWrite()
                with conn.begin():
                    self._append_batch(conn, batch, write, check_calls=True)
        except LedgerUnavailable as exc:  # the SQLite file is gone: say so, no traceback
            log.error("%s: %d appends refused", exc, len(batch))
            self._fail(batch, exc)
            return
        except (SQLAlchemyError, self._sql.dbapi_errors) as exc:
            error = LedgerUnavailable(f"the ledger database could not commit: {short_error(exc)}")
            if write.committing and link_broke(conn):
                self._doubt(batch, write, error, exc)
            else:
                log.warning(
                    "ledger commit failed, %d appends refused: %s", len(batch), short_error(exc)
                )
                self._fail(batch, error)
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
        self._known_schemas.update(write.schemas)
        for head in write.heads:
            self._note_committed(head)
        for pending, outcome in write.outcomes:
            if isinstance(outcome, Exception):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)

    def _note_committed(self, head: ChainHead) -> None:
        """Keep ``head`` for the next batch and schedule its timer checkpoint. The due time
        a locked read gives replaces the scheduled one; a kept head's stale checkpoint
        columns (early, at worst) only schedule a chain that had none."""
        if head.checkpoint_size >= head.seq:
            self._uncheckpointed.pop(head.chain, None)
        elif not head.stale_checkpoint or head.chain not in self._uncheckpointed:
            due = head.checkpoint_at / 1000 + self.checkpoint_interval_s
            self._uncheckpointed[head.chain] = due
        self._heads[head.chain] = head.kept()
        self._raise_high_water(head.chain, head.seq, head.hash)

    def _raise_high_water(self, chain: str, seq: int, entry_hash: str) -> None:
        with self._high_water_lock:
            if seq > self._high_water.get(chain, (0, ""))[0]:
                self._high_water[chain] = (seq, entry_hash)

    def _check_high_water(self, chain: str, seq: int, entry_hash: str) -> None:
        """Raise ChainBehind when the head read under the lock is behind what this ledger
        saw committed (a lower seq, or the same seq holding another receipt); else raise
        the mark to it."""
        seen = self._high_water.get(chain)
        if seen is not None and (seq < seen[0] or (seq == seen[0] and entry_hash != seen[1])):
            raise _moved_back(chain, seq, seen[0])
        self._raise_high_water(chain, seq, entry_hash)

    def _doubt(
        self,
        batch: list[_Pending],
        write: _BatchWrite,
        error: LedgerUnavailable,
        exc: BaseException,
    ) -> None:
        """The connection broke after COMMIT went out: the batch may have landed. Its
        sealed receipts wait (their callers until their deadline) while the database is
        asked which landed; the drafts it refused, and any it never sealed, fail now."""
        sealed = write.sealed()
        log.warning(
            "ledger connection lost during COMMIT (%s): whether %d receipts landed is asked"
            " of the database",
            short_error(exc),
            len(sealed),
        )
        self._doubts.extend((pending, receipt, error) for pending, receipt in sealed)
        in_doubt = {pending for pending, _ in sealed}
        for pending, outcome in write.outcomes:
            if isinstance(outcome, Exception):
                _resolve(pending, outcome)
        self._fail([p for p in batch if p not in in_doubt], error)  # claim() skips the done
        self._settle_doubts()

    def _settle_doubts(self, *, last_try: bool = False) -> None:
        """Resolve the receipts in doubt from what the database holds: one stored at its seq
        with its entry hash landed (its future gets it; a caller that gave up meanwhile
        reports it as committed late), any other did not and fails. It is read under the
        chains' head locks: a transaction of the broken connection still committing (waiting
        for a synchronous standby, a slow disk) holds its chain's head, and its receipt is
        not yet visible. While the database does not answer, or that lock is not had within
        the writer's lock_timeout, they stay in doubt until the next tick; on ``last_try``
        (the writer stops) they fail as unknown, each logged."""
        if not self._doubts:
            return
        try:
            conn = self._link.get()
            with self._busy(), conn.begin():
                with closing(driver_cursor(conn)) as cursor:
                    for chain in sorted({receipt.chain for _, receipt, _ in self._doubts}):
                        self._sql.lock_head(cursor, chain)
                stored = [
                    queries.entry_hash(conn, receipt.chain, receipt.seq)
                    for _, receipt, _ in self._doubts
                ]
        except (SQLAlchemyError, self._sql.dbapi_errors, LedgerUnavailable) as exc:
            self._link.drop()
            if not last_try:
                return
            for pending, receipt, error in self._doubts:
                log.error(
                    "receipt %s (chain %r, seq %d) may or may not have committed: the ledger"
                    " closed before the database answered (%s); callproof ledger verify shows",
                    receipt.id,
                    receipt.chain,
                    receipt.seq,
                    short_error(exc),
                )
                _resolve(pending, error)
            self._doubts.clear()
            return
        landed = 0
        for (pending, receipt, error), found in zip(self._doubts, stored, strict=True):
            if found == receipt.entry_hash:
                landed += 1
                self._raise_high_water(receipt.chain, receipt.seq, receipt.entry_hash)
                self._uncheckpointed.setdefault(receipt.chain, time.time())
                _resolve(pending, receipt)
            else:
                _resolve(pending, error)
        log.warning("%d of %d receipts whose COMMIT lost its reply had landed", landed, len(stored))
        self._doubts.clear()

    def _find_unsigned_chains(self) -> None:
        """At start and every checkpoint_interval_s: schedule the timer checkpoint of chains
        whose last receipts this key sealed and no checkpoint covers. A writer of this key
        stopped without signing them: this process before a crash, or another replica that
        shares the key and was killed while this one runs (which only a scan finds: it
        extended those chains itself)."""
        if time.monotonic() < self._unsigned_scan_at:
            return
        try:
            conn = self._link.get()
            with self._busy(), conn.begin():
                found = queries.unsigned_chains(conn, self.signer.key_id)
        except (SQLAlchemyError, self._sql.dbapi_errors, LedgerUnavailable) as exc:
            # appends say what is wrong with the database; the next tick asks again
            log.debug("chains left unsigned could not be looked up: %s", short_error(exc))
            self._link.drop()
            return
        for chain, checkpoint_at in found.items():
            due = checkpoint_at / 1000 + self.checkpoint_interval_s
            self._uncheckpointed.setdefault(chain, due)
        self._unsigned_scan_at = time.monotonic() + self.checkpoint_interval_s

    def _fail(self, batch: list[_Pending], error: Exception) -> None:
        """Refuse the whole batch. Whether its transaction committed may be unknown (the
        connection broke during COMMIT), so the kept heads and the connection go too."""
        self._link.drop()
        for pending in batch:
            if pending.claim():  # a cancelled future would refuse it, killing this thread
                pending.future.set_exception(error)

    def _append_batch(
        self,
        conn: sa.Connection,
        batch: list[_Pending],
        write: _BatchWrite,
        *,
        kept: bool = False,
        check_calls: bool = False,
    ) -> None:
        """Inside one transaction: seal each chain's drafts onto its head, write every row
        and commit, filling ``write``."""
        by_chain: dict[str, list[_Pending]] = {}
        for pending in batch:
            by_chain.setdefault(pending.draft.tenant, []).append(pending)
        if not self._key_registered:
            register_signing_key(conn, self.signer)
        for chain in sorted(by_chain):  # one lock order in every process: no deadlock
            if all(pending.future.cancelled() for pending in by_chain[chain]):
                continue  # nobody waits: not even a new chain's head row is made for them
            try:
                head = self._heads[chain].kept() if kept else self._head_for_batch(conn, chain)
            except ChainBehind as exc:  # this chain's drafts alone: the others go on
                self._heads.pop(chain, None)  # stale: the next batch must lock and refuse it
                write.outcomes.extend((p, exc) for p in by_chain[chain] if p.claim())
                continue
            # the drafts someone still waits for; a caller that gave up while this writer
            # waited for the lock is dropped here, before its receipt is sealed
            live = [pending for pending in by_chain[chain] if pending.claim()]
            refused = _refuse_duplicate_calls(conn, chain, live) if check_calls else {}
            self._seal_onto(head, live, refused, write)
        tables = {table.__table__: values for table, values in write.rows.items()}
        with closing(driver_cursor(conn)) as cursor:  # nothing may follow: this commits
            write.committing = True
            self._sql.write_and_commit(cursor, tables, [head.row() for head in write.heads])

    def _head_for_batch(self, conn: sa.Connection, chain: str) -> ChainHead:
        """The head a batch seals onto (`_lock_and_read_head`); a head that moved since this
        writer last committed it marks the chain as shared with another writer, so later
        batches lock it up front rather than seal onto the head kept in memory."""
        head = self._lock_and_read_head(conn, chain)
        known = self._heads.get(chain)
        if known is not None and known.seq != head.seq:
            self._shared.add(chain)  # another writer extends it too: lock up front
        return head

    def _seal_onto(
        self,
        head: ChainHead,
        live: list[_Pending],
        refused: Mapping[_Pending, Exception],
        write: _BatchWrite,
    ) -> None:
        """Seal ``live`` drafts (but the ``refused``) onto ``head`` in order, adding their
        rows and outcomes, the chain's new tree nodes and key range, and a checkpoint when
        one falls due, to ``write``."""
        first_seq = head.seq + 1
        for pending in live:
            if pending in refused:
                write.outcomes.append((pending, refused[pending]))
                continue
            try:
                receipt = seal(
                    pending.draft, seq=head.seq + 1, prev_hash=head.hash, signer=self.signer
                )
            except ReceiptFormatError as exc:  # e.g. a NaN in tool arguments: this one only
                write.outcomes.append((pending, exc))
                continue
            head.add_leaf(receipt.entry_hash)
            _add_receipt_rows(receipt, write.rows)
            bound = receipt.manifest["schema_hash"]
            if (
                bound is not None
                and bound not in self._known_schemas
                and bound not in write.schemas
            ):
                write.schemas.add(bound)
                write.rows[SchemaRow].append(
                    {"hash": bound, "body": canonical_json(pending.draft.schema).decode()}
                )
            write.outcomes.append((pending, receipt))
        if head.seq < first_seq:
            return  # nothing sealed: leave the row alone (a kept head may be stale)
        if head.key_id != self.signer.key_id:
            write.rows[KeyRangeRow].append(
                {"chain": head.chain, "first_seq": first_seq, "key_id": self.signer.key_id}
            )
            head.key_id = self.signer.key_id
        write.rows[MerkleNodeRow].extend(head.new_nodes)
        if self._checkpoint_due(head):
            write.rows[CheckpointRow].append(_checkpoint_row(self._sign_checkpoint(head)))
        write.heads.append(head)

    def _lock_and_read_head(self, conn: sa.Connection, chain: str) -> ChainHead:
        """Lock the chain's head row (creating the chain on its first append) and read it;
        a head below its own checkpoint or this ledger's high-water mark raises ChainBehind."""
        with closing(driver_cursor(conn)) as cursor:
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
            raise _behind(chain, row["head_seq"], row["checkpoint_size"])
        self._check_high_water(chain, row["head_seq"], row["head_hash"])
        frontier = [bytes.fromhex(h) for h in row["frontier"].split(",") if h]
        return ChainHead(
            chain,
            row["head_hash"],
            CompactRange(row["head_seq"], frontier),
            row["key_id"],
            row["checkpoint_size"],
            row["checkpoint_at"],
        )

    def _save_checkpoint_and_commit(self, conn: sa.Connection, head: ChainHead) -> dict[str, Any]:
        if head.key_id != self.signer.key_id:  # a key rotated in signs before its first receipt
            register_signing_key(conn, self.signer)
        checkpoint = self._sign_checkpoint(head)
        with closing(driver_cursor(conn)) as cursor:
            self._sql.write_and_commit(
                cursor, {CheckpointRow.__table__: [_checkpoint_row(checkpoint)]}, [head.row()]
            )
        return checkpoint

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_due(self, head: ChainHead) -> bool:
        """Every ``checkpoint_every`` receipts, or ``checkpoint_interval_s`` after the last."""
        return head.seq > head.checkpoint_size and (
            head.seq - head.checkpoint_size >= self.checkpoint_every
            or time.time() - head.checkpoint_at / 1000 >= self.checkpoint_interval_s
        )

    def _sign_checkpoint(self, head: ChainHead) -> dict[str, Any]:
        """A signed checkpoint at ``head``, which records it as its latest."""
        checkpoint = make_checkpoint(head.chain, head.seq, head.root(), self.signer)
        head.checkpoint_size, head.checkpoint_at = head.seq, int(time.time() * 1000)
        head.stale_checkpoint = False  # the newest: this writer just signed it
        return checkpoint

    def checkpoint_now(self, tenant: str) -> dict[str, Any]:
        """A signed checkpoint at the chain's head: the stored one if it is current."""
        if self._file is not None:
            self._file.check()
        with transaction(self._engine, "could not commit") as conn:
            head = self._lock_and_read_head(conn, tenant)
            if head.seq == 0:
                raise OutOfRange(f"chain {tenant!r} has no receipts to checkpoint")
            latest = queries.latest_checkpoint(conn, tenant)
            if latest is not None and latest["tree_size"] > head.seq:
                raise _behind(tenant, head.seq, latest["tree_size"])
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
                conn = self._link.get()
                with self._busy(), conn.begin():
                    head = self._lock_and_read_head(conn, chain)
                    if head.key_id != self.signer.key_id:
                        # Another replica's key signed the head (a rolling restart): its
                        # checkpoints are that replica's; ours would pass our key's range.
                        self._uncheckpointed.pop(chain, None)
                        continue
                    if self._checkpoint_due(head) or (closing and head.seq > head.checkpoint_size):
                        self._save_checkpoint_and_commit(conn, head)
                self._note_committed(head)
            except ChainBehind as exc:  # not on the next tick either: an operator must look
                log.error("checkpoint of chain %r refused: %s", chain, exc)
                self._uncheckpointed.pop(chain, None)
                self._heads.pop(chain, None)
            except (SQLAlchemyError, self._sql.dbapi_errors, ReceiptsError) as exc:  # next tick
                log.warning("checkpoint of chain %r failed: %s", chain, short_error(exc))
                self._link.drop()


def _resolve(pending: _Pending, outcome: Receipt | Exception) -> None:
    """Give an append of a doubted batch its outcome, unless something already did (a
    writer bug's catch-all failing the batch): a future resolved twice would kill the
    writer thread."""
    if pending.future.done():
        return
    if isinstance(outcome, Exception):
        pending.future.set_exception(outcome)
    else:
        pending.future.set_result(outcome)


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
            seq = taken.get(clash[0])
            where = f" (seq {seq})" if seq is not None else " (by another draft of this batch)"
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


def _insert_ignore(conn: sa.Connection, table: type, values: list[dict[str, Any]]) -> None:
    conn.execute(insert_ignore(table.__table__, conn.dialect), values)


def _behind(chain: str, head: int, signed: int) -> ChainBehind:
    """A chain whose head is below a checkpoint already signed lost receipts: it is neither
    extended nor signed again until an operator looks (callproof ledger verify)."""
    return ChainBehind(
        f"chain {chain!r} is behind its own checkpoint (head {head}, signed {signed}):"
        " receipts were removed; refusing to extend or sign it"
    )


def _moved_back(chain: str, head: int, seen: int) -> ChainBehind:
    """A chain whose head went back below one this ledger saw committed (or holds another
    receipt at its seq: it went back and grew again): the database was restored or failed
    over to a copy that lacks receipts their callers already hold, and maybe checkpoints
    this key signed. Sealing past it would sign a second history."""
    if head < seen:
        what = f"went back from seq {seen} to seq {head}"
        lost = f"receipts {head + 1}..{seen} are gone"
    else:
        what = f"holds another receipt at seq {seen} than the one this ledger saw there"
        lost = "receipts up to it were replaced"
    return ChainBehind(
        f"chain {chain!r} {what} (a database restored from a backup, or a standby that"
        f" lagged promoted): {lost}, and their callers hold them; refusing to extend or"
        " sign the chain, which would give those seqs a second history under the same key."
        " Restore them if a later backup or the WAL has them; to go on without them, restart"
        " the gateway (docs/deploy.md, backups)"
    )
