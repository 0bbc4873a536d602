"""The Ledger: per-tenant receipt chains in one database (Postgres or SQLite), and
everything done with them. It holds no logic of its own; each concern has its module:

- receipts/ledger_writer.py: the writer thread (group-committed, serialised appends) and
  the signed checkpoints;
- receipts/queries.py: the audit reads;
- receipts/ledger_proofs.py: inclusion and consistency proofs from the stored tree;
- receipts/ledger_verify.py: verification of the chain as stored;
- receipts/ledger_export.py: bundles that verify offline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Self

import sqlalchemy as sa

from receipts import key_ranges, ledger_proofs, queries
from receipts.chain import VerificationReport
from receipts.errors import LedgerUnavailable, ReadOnlyLedger, ReceiptFormatError
from receipts.ledger_export import export_bundle
from receipts.ledger_file import LedgerFile, sqlite_file
from receipts.ledger_proofs import ConsistencyProof, InclusionProof
from receipts.ledger_verify import verify_stored
from receipts.ledger_writer import LedgerWriter
from receipts.queries import ReceiptPage, ReceiptQuery, ShouldStop
from receipts.record import PAYLOAD_MEMBERS, Receipt, ReceiptDraft
from receipts.signing import KeyRing, PublicKeyEntry, Signer
from receipts.store import create_engine, transaction

__all__ = ["Ledger", "ReceiptPage", "ReceiptQuery"]

# The reader's own sessions are READ ONLY, so its transaction_read_only says nothing about
# the writer's; the default that every new session (the writer's too) starts with does.
_POSTGRES_READ_ONLY = sa.text(
    "SELECT pg_is_in_recovery() OR current_setting('default_transaction_read_only')::bool"
)


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
        self.retain_payloads = retain_payloads
        self._reader = create_engine(url, snapshots=True)
        path = sqlite_file(url)
        self._file = LedgerFile(path) if path is not None else None
        self._writer = (
            None
            if signer is None
            else LedgerWriter(
                url,
                signer,
                checkpoint_every=checkpoint_every,
                checkpoint_interval_s=checkpoint_interval_s,
                max_batch=max_batch,
                file=self._file,
            )
        )

    def start(self) -> None:
        """Start the writer now (else the first append does): a gateway's ledger signs the
        checkpoints due on chains a crash left unsigned without waiting for traffic."""
        if self._writer is not None:
            self._writer.start()

    def close(self) -> None:
        """Commit what is queued, stop the writer thread and release the connections."""
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self._reader.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self, stalled_after_s: float | None = None) -> None:
        """Raise LedgerUnavailable unless the database answers (a SQLite file still where it
        was opened) and, for a ledger that signs, would take appends: a Postgres standby, or
        a database whose sessions start read-only, answers every read while refusing every
        receipt, so it is not a ledger that is up; nor is one whose writer has been inside
        one transaction for more than ``stalled_after_s`` (a commit waiting for a
        synchronous standby that is gone answers no receipt, while reads go on)."""
        if self._writer is not None:
            self._writer.check_running()
            stalled = self._writer.stalled_for()
            if stalled_after_s is not None and stalled > stalled_after_s:
                raise LedgerUnavailable(
                    f"the ledger's writer has waited {stalled:.1f} s for one transaction: the"
                    " database answers reads but does not finish commits (a synchronous"
                    " standby gone, a full disk, a lock held)"
                )
        with self._reading() as conn:
            if self.signer is None or conn.dialect.name != "postgresql":
                conn.execute(sa.text("SELECT 1"))
            elif conn.execute(_POSTGRES_READ_ONLY).scalar():
                raise LedgerUnavailable(
                    "the ledger database is read-only (a standby, or"
                    " default_transaction_read_only is on): no receipt can commit"
                )

    # ------------------------------------------------------------------ appends

    def append(self, draft: ReceiptDraft) -> Receipt:
        """Seal ``draft`` onto its tenant's chain; returns once the receipt is committed.

        Raises LedgerUnavailable when the database cannot commit (fail closed), and
        ReceiptFormatError for a draft the chain refuses (a call id it already recorded).
        An append whose COMMIT lost its reply waits until the database says whether it
        landed, or the ledger closes; a caller with a deadline waits on ``submit``'s future.
        """
        return self.submit(draft).result()

    def submit(self, draft: ReceiptDraft) -> Future[Receipt]:
        """Queue ``draft`` for the next group commit; the future resolves after the commit.
        Without retain_payloads, the messages and parameters themselves are dropped here and
        only their digests are kept."""
        if not isinstance(draft, ReceiptDraft):
            raise ReceiptFormatError(f"append takes a ReceiptDraft, not {type(draft).__name__}")
        if self._writer is None:
            raise ReadOnlyLedger("this ledger was opened without a signer: it cannot append")
        if not self.retain_payloads and not draft.request.keys().isdisjoint(PAYLOAD_MEMBERS):
            request = {k: v for k, v in draft.request.items() if k not in PAYLOAD_MEMBERS}
            draft = dataclasses.replace(draft, request=request)
        return self._writer.submit(draft)

    def queued_appends(self) -> int:
        """Receipts submitted and not yet committed (0 for a read-only ledger)."""
        return 0 if self._writer is None else self._writer.queued()

    def checkpoint_now(self, tenant: str) -> dict[str, Any]:
        """A signed checkpoint at the chain's head: the stored one if it is current."""
        if self._writer is None:
            raise ReadOnlyLedger("this ledger was opened without a signer: it cannot sign")
        return self._writer.checkpoint_now(tenant)

    # ------------------------------------------------------------------ reads

    def _reading(self) -> AbstractContextManager[sa.Connection]:
        if self._file is not None:  # a SQLite file removed while open: fail, do not recreate
            self._file.check()
        return transaction(self._reader, "is unavailable")

    def query(self, q: ReceiptQuery) -> ReceiptPage:
        with self._reading() as conn:
            return queries.query(conn, q)

    def get(self, tenant: str, receipt_id: str) -> Receipt | None:
        with self._reading() as conn:
            return queries.get(conn, tenant, receipt_id)

    def find_call(self, tenant: str, call_id: str) -> Receipt | None:
        with self._reading() as conn:
            return queries.find_call(conn, tenant, call_id)

    def issuers(self, tenant: str, call_ids: Collection[str]) -> dict[str, str]:
        """The id of the receipt that issued each of ``call_ids`` (an id none issued is
        absent), read together: a request's tool results are linked in one transaction."""
        with self._reading() as conn:
            return queries.issuers(conn, tenant, call_ids)

    def answers_to(self, tenant: str, call_id: str) -> ReceiptPage:
        """The first receipts answering ``call_id``; ``next_cursor`` (an ``after_seq`` for
        ``ReceiptQuery(answering=call_id)``) when there are more."""
        with self._reading() as conn:
            return queries.answers_to(conn, tenant, call_id)

    def schema(self, schema_hash: str) -> dict[str, Any] | None:
        with self._reading() as conn:
            return queries.schema(conn, schema_hash)

    def public_keys(self, tenant: str | None = None) -> list[PublicKeyEntry]:
        """Registered keys with the seq ranges each signed (``KeyRing.from_public_keys``)."""
        with self._reading() as conn:
            return key_ranges.public_keys(conn, tenant)

    def chain_keys(self, tenant: str) -> list[PublicKeyEntry]:
        """The keys an auditor pins for ``tenant``'s chain: those that signed it, with their
        seq ranges; before its first receipt, this ledger's key, which will sign it (no range
        yet), so that it can be pinned before anything is signed."""
        with self._reading() as conn:
            if self.signer is not None and queries.reach(conn, tenant) == 0:
                return [
                    PublicKeyEntry(
                        key_id=self.signer.key_id,
                        public_key_pem=self.signer.public_key_pem(),
                        ranges=[],
                    )
                ]
            return key_ranges.public_keys(conn, tenant)

    def reach(self, tenant: str) -> int:
        """How far the chain reaches (queries.reach): not only the highest stored seq, so a
        range check against it cannot hide a deleted receipt."""
        with self._reading() as conn:
            return queries.reach(conn, tenant)

    def latest_checkpoint(self, tenant: str) -> dict[str, Any] | None:
        with self._reading() as conn:
            return queries.latest_checkpoint(conn, tenant)

    def chains(self) -> list[str]:
        with self._reading() as conn:
            return queries.chains(conn)

    # ------------------------------------------------------------------ proofs

    def inclusion_proof(
        self, tenant: str, seq: int, tree_size: int | None = None
    ) -> InclusionProof:
        """RFC 9162 inclusion proof of receipt ``seq`` (see ledger_proofs)."""
        with self._reading() as conn:
            return ledger_proofs.inclusion_proof(conn, tenant, seq, tree_size)

    def consistency_proof(
        self, tenant: str, size1: int, size2: int | None = None
    ) -> ConsistencyProof:
        """RFC 9162 consistency proof between two tree sizes (see ledger_proofs)."""
        with self._reading() as conn:
            return ledger_proofs.consistency_proof(conn, tenant, size1, size2)

    # ------------------------------------------------------------------ verification, export

    def verify(
        self,
        tenant: str,
        from_seq: int | None = None,
        to_seq: int | None = None,
        *,
        keyring: KeyRing | None = None,
        saved: Sequence[Mapping[str, Any]] = (),
        should_stop: ShouldStop | None = None,
    ) -> VerificationReport:
        """Verify the chain (or seqs ``from_seq..to_seq``) as stored, naming the first failing
        seq (see ledger_verify.verify_stored; ``should_stop``: give up, raising Stopped).
        Raises OutOfRange for a range that is reversed or goes past the chain's reach."""
        with self._reading() as conn:
            return verify_stored(
                conn,
                tenant,
                from_seq,
                to_seq,
                keyring=keyring,
                saved=saved,
                should_stop=should_stop,
            )

    def export(
        self,
        tenant: str,
        out: str | Path | IO[bytes],
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        *,
        should_stop: ShouldStop | None = None,
    ) -> None:
        """Write the bundle of the tenant's receipts created in [since, until) to ``out``;
        open-ended, it runs to a checkpoint signed now when this ledger has a signer (see
        ledger_export.export_bundle; ``should_stop``: give up, raising Stopped)."""
        export_bundle(
            self._reading,
            tenant,
            out,
            since,
            until,
            sign_checkpoint=None if self._writer is None else self._writer.checkpoint_now,
            should_stop=should_stop,
        )
