"""Verification of a chain as the database stores it: the chain verifier's checks
(receipts.chain) over the stored rows, plus what only a database can get wrong."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from receipts import queries
from receipts.chain import VerificationReport, saved_checkpoints_note, verify_receipts
from receipts.checkpoint import check_checkpoint, checkpoint_problem
from receipts.errors import ChainDamaged, OutOfRange, ReceiptFormatError, ReceiptsError
from receipts.key_ranges import public_keys
from receipts.ledger_proofs import with_stored_tree
from receipts.merkle import CompactRange, compact_range, consistency_proof, leaf_hash
from receipts.record import GENESIS_PREV_HASH
from receipts.signing import KeyRing
from receipts.trust import pinned_note

W = TypeVar("W")


def verify_stored(
    conn: sa.Connection,
    tenant: str,
    from_seq: int | None = None,
    to_seq: int | None = None,
    *,
    keyring: KeyRing | None = None,
    saved: Sequence[Mapping[str, Any]] = (),
    should_stop: queries.ShouldStop | None = None,
) -> VerificationReport:
    """Verify the chain (or seqs ``from_seq..to_seq``) as stored, naming the first
    failing seq.

    Streams the rows through receipts.chain.verify_receipts (hashes, signatures, links,
    schema binding, Merkle root against a signed checkpoint) and also checks what only
    the database can get wrong: indexed columns that disagree with the signed body, every
    stored checkpoint in the range (signature and root), rows beyond or missing before
    the chain's head. ``saved`` are checkpoints the auditor kept, which the stored
    receipts must still reach with the same roots (a database rewritten or cut back since,
    stored checkpoints included, fails), whatever range is asked for: one outside it is
    checked through a consistency proof from the stored tree; ``keyring`` pins trusted keys
    (default: the keys the database lists, which an attacker with write access could extend).
    ``should_stop`` is asked between receipts; when it says so, Stopped is raised. A range
    that is reversed or ends past the chain's reach (queries.reach) raises OutOfRange.
    """
    head = queries.head_row(conn, tenant)
    head_seq = head.head_seq if head else 0
    last = queries.last_seq(conn, tenant)
    reach = max(head_seq, last)  # queries.reach, from the two parts the tail checks need
    start = from_seq or 1
    end = to_seq if to_seq is not None else reach
    if start < 1 or end < start - 1:
        raise OutOfRange(f"bad seq range {start}..{end}")
    if end > reach:
        raise OutOfRange(f"chain {tenant!r} ends at seq {reach}: seq {end} is beyond its head")
    pinned = keyring is not None
    if keyring is None:
        try:
            keyring = KeyRing.from_public_keys(public_keys(conn, tenant))
        except ReceiptsError as exc:  # a key row that lies is damage to report, not a crash
            return VerificationReport.failed(f"stored signing keys: {exc}", chain=tenant)
    checkpoint = _covering_checkpoint(conn, tenant, start, to_seq)
    spans = _outside_spans(saved, start, end, head_seq)
    try:
        left, right = _range_context(conn, tenant, start, end, checkpoint, to_seq)
        consistency = _consistency_proofs(conn, tenant, spans)
    except ChainDamaged as exc:  # what verification is for: a report, not an error
        return VerificationReport.failed(str(exc), chain=tenant)
    prev = GENESIS_PREV_HASH if start == 1 else queries.entry_hash(conn, tenant, start - 1)
    if prev is None:
        return VerificationReport.failed(
            "receipt missing from the database", seq=start - 1, chain=tenant
        )
    rows = _CheckedRows(
        queries.stream_rows(conn, tenant, start, end, should_stop),
        _Window(lambda first, last: queries.index_rows(conn, tenant, first, last)),
        _Window(lambda first, last: queries.merkle_nodes_ending(conn, tenant, first, last)),
        CompactRange(start - 1, left or []),
        queries.checkpoints(conn, tenant, start, end),
        keyring,
    )
    report = verify_receipts(
        rows,
        keyring,
        expected_prev_hash=prev,
        start_seq=start,
        checkpoint=checkpoint,
        schemas=lambda h: queries.schema(conn, h),  # SchemaBinding remembers (bounded)
        left=left,
        right=right,
        saved=saved,
        consistency=consistency,
        chain=tenant,
    )
    problems = [rows.problem] if rows.problem else []
    if not report.ok:
        problems.append((report.first_failure_seq, report.reason))
    if rows.derived_problem:  # after the body's own reasons: at one seq, those say more
        problems.append(rows.derived_problem)
    problems += _tail_problems(conn, tenant, head_seq, last, end, whole=to_seq is None)
    seen_to = start + rows.seen - 1 if report.ok else end  # end: it stopped at a failure
    if seen_to < end:  # the stored receipts stop short of the head, or of the range's end
        asked = f"the chain head ({head_seq})" if to_seq is None else f"seq {end}, the range's end"
        problems.append((seen_to + 1, f"receipt missing: the stored receipts end before {asked}"))
    if problems:
        seq, reason = min(problems, key=lambda p: float("inf") if p[0] is None else p[0])
        return VerificationReport.failed(reason, seq=seq, checked=report.checked, chain=tenant)
    notes = _passed_notes(report, _trust_note(keyring, pinned), saved, start, end)
    return dataclasses.replace(report, notes=notes)


def _tail_problems(
    conn: sa.Connection, tenant: str, head_seq: int, last: int, end: int, *, whole: bool
) -> list[tuple[int, str]]:
    """What lies past the head row: receipts stored beyond it (the head only grows, so they
    were put there) when the verification reaches past it, and, verifying the ``whole``
    chain, index rows beyond its end."""
    problems = []
    if end > head_seq and last > head_seq:
        problems.append((head_seq + 1, f"receipt stored beyond the chain head ({head_seq})"))
    if whole:
        stray = queries.index_rows(conn, tenant, end + 1, None)
        if seq := min(stray.calls.keys() | stray.links.keys(), default=0):
            problems.append((seq, f"index rows for seq {seq}, which the chain does not hold"))
    return problems


def _passed_notes(
    report: VerificationReport,
    trust: str,
    saved: Sequence[Mapping[str, Any]],
    start: int,
    end: int,
) -> tuple[str, ...]:
    """What a passing report must still say: whose keys were trusted, which saved checkpoints
    were reached and how, and any receipts no signed root covers."""
    outside = [cp for cp in saved if not start - 1 <= cp["tree_size"] <= end]
    notes = [
        trust,
        *saved_checkpoints_note([cp for cp in saved if cp not in outside]),
        *_outside_note(outside, start, end),
    ]
    if report.tree_size is None and not any(cp["tree_size"] >= start for cp in saved):
        notes.append(
            "no signed checkpoint covers these receipts: their Merkle root was not checked"
            " and a tail cut off would not show; keep the latest checkpoint and verify"
            " against it later"
        )
    elif report.tree_size is not None and report.last_seq and report.last_seq > report.tree_size:
        notes.append(
            f"seq {report.tree_size + 1}..{report.last_seq} are past the latest signed"
            f" checkpoint (tree size {report.tree_size}): their Merkle root is not signed yet"
            " (POST /audit/checkpoints signs one now)"
        )
    return tuple(notes)


def _covering_checkpoint(
    conn: sa.Connection, tenant: str, start: int, to_seq: int | None
) -> dict[str, Any] | None:
    """The stored checkpoint a verification checks the Merkle root against: the latest
    (so a truncated tail shows), or for a range the first one at or after its end. None when
    it predates the range: the receipts checked cannot reach its root, and none signs theirs
    (a tail from past the latest checkpoint is intact, not a failure; the report says no
    signed root covers it)."""
    if to_seq is None:
        checkpoint = queries.latest_checkpoint(conn, tenant)
    else:
        checkpoint = queries.checkpoint_at_least(conn, tenant, to_seq)
        if checkpoint is None:
            checkpoint = queries.latest_checkpoint(conn, tenant, max_size=to_seq)
    return checkpoint if checkpoint and checkpoint["tree_size"] >= start - 1 else None


def _outside_spans(
    saved: Sequence[Mapping[str, Any]], start: int, end: int, head_seq: int
) -> set[tuple[int, int]]:
    """(size1, size2) of the consistency proof each saved checkpoint outside seqs
    ``start..end`` needs: from its size to the tree before ``start``, or from the tree at
    ``end`` to its size. No span for one past the chain's head (the stored tree ends first:
    the chain was cut back since, which the verifier reports) or a malformed one (the
    verifier names it)."""
    spans = set()
    for cp in saved:
        try:
            check_checkpoint(cp)
        except ReceiptFormatError:
            continue
        size = cp["tree_size"]
        if size < start - 1:
            spans.add((size, start - 1))
        elif end < size <= head_seq:
            spans.add((end, size))
    return spans


def _consistency_proofs(
    conn: sa.Connection, tenant: str, spans: set[tuple[int, int]]
) -> dict[tuple[int, int], list[bytes]]:
    """RFC 9162 consistency proofs for ``spans``, read from the stored tree (none from the
    empty tree: it is a prefix of every tree)."""
    if not spans:
        return {}
    return with_stored_tree(
        conn,
        tenant,
        lambda subtree: {
            span: consistency_proof(*span, subtree) if span[0] else [] for span in spans
        },
    )


def _outside_note(outside: Sequence[Mapping[str, Any]], start: int, end: int) -> tuple[str, ...]:
    """What a passing report says of saved checkpoints outside the range: checked through
    the stored tree, which the receipts outside the range were not re-checked against."""
    if not outside:
        return ()
    sizes = ", ".join(str(cp["tree_size"]) for cp in outside)
    note = (
        f"the saved checkpoint(s) of tree size {sizes} lie outside seq {start}..{end}: a"
        " consistency proof from the stored Merkle tree shows the receipts checked are in"
        " the same history; the receipts outside the range were not re-checked (verify the"
        " whole chain for that)"
    )
    return (note,)


def _range_context(
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
    return with_stored_tree(
        conn,
        tenant,
        lambda subtree: (
            compact_range(0, start - 1, subtree),
            compact_range(end, size, subtree) if want_right else None,
        ),
    )


class _Window(Generic[W]):
    """Rows derived from the receipts (index rows, Merkle nodes) for the seqs being checked,
    loaded a chunk of seqs at a time as the receipts stream past: constant memory."""

    def __init__(self, load: Callable[[int, int], W]):
        self._load = load
        self._last = 0
        self._rows: W | None = None

    def at(self, seq: int) -> W:
        """What ``load(first, last)`` returned for a chunk holding ``seq``."""
        if self._rows is None or seq > self._last:
            self._last = seq + queries.STREAM_CHUNK - 1
            self._rows = self._load(seq, self._last)
        return self._rows


class _CheckedRows:
    """Receipt rows -> JSON objects for the chain verifier, stopping at the first row whose
    indexed columns or index rows (receipt_calls, receipt_links) disagree with its signed
    body (a query could be steered by such a row) or that completes a tree whose stored
    checkpoint is forged or does not match."""

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
        index: _Window[queries.IndexRows],
        nodes: _Window[dict[tuple[int, int], bytes]],
        tree: CompactRange,
        checkpoints: Mapping[int, Mapping[str, Any]],
        keyring: KeyRing,
    ) -> None:
        self._rows = rows
        self._index = index
        self._nodes = nodes
        self._tree = tree  # over the entry hashes read so far, for the stored checkpoints
        self._checkpoints = checkpoints
        self._keyring = keyring
        self.seen = 0
        self.problem: tuple[int, str] | None = None
        self.derived_problem: tuple[int, str] | None = None  # the first; the rows go on

    def __iter__(self) -> Iterator[dict[str, Any] | str]:
        for row in self._rows:
            try:
                obj = json.loads(row.body)
            except ValueError:
                self.problem = (row.seq, "stored receipt body is not JSON")
                return
            mismatch = self._mismatch(row, obj) if isinstance(obj, dict) else "the row's body"
            if mismatch:
                self.problem = (row.seq, f"{mismatch} disagrees with the signed receipt body")
                return
            if self.derived_problem is None and (lie := self._index_mismatch(row.seq, obj)):
                self.derived_problem = (row.seq, f"{lie} disagree with the signed receipt body")
            self.seen += 1
            yield obj
            completed = self._tree.append(leaf_hash(bytes.fromhex(row.entry_hash)))
            if self.derived_problem is None and (bad := self._node_mismatch(completed)):
                self.derived_problem = (row.seq, bad)
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
        """What of the row disagrees with its body: a column, or its index rows."""
        for column in self.COLUMNS:
            if getattr(row, column) != obj.get(column):
                return f"row column {column!r}"
        manifest, output = obj.get("manifest"), obj.get("output")
        if not isinstance(manifest, dict) or not isinstance(output, dict):
            return None  # malformed bodies are the chain verifier's to name
        for column, value in (
            ("model", manifest.get("model")),
            ("schema_hash", manifest.get("schema_hash")),
            ("output_kind", output.get("kind")),
        ):
            if getattr(row, column) != value:
                return f"row column {column!r}"
        return None

    def _node_mismatch(self, completed: list[tuple[int, int, bytes]]) -> str | None:
        """A stored Merkle node (what inclusion and consistency proofs are read from) that is
        missing or differs from the subtree this receipt completes."""
        stored = self._nodes.at(self._tree.size)
        for level, idx, node in completed:
            if stored.get((level, idx)) != node:
                state = "missing" if (level, idx) not in stored else "wrong"
                return (
                    f"stored Merkle node at level {level}, index {idx} is {state}: the proofs"
                    " served from it do not match the receipts"
                )
        return None

    def _index_mismatch(self, seq: int, obj: dict[str, Any]) -> str | None:
        """Which of the receipt's index rows (its calls, its links) disagree with its body."""
        index = self._index.at(seq)
        calls, links = index.calls.get(seq, set()), index.links.get(seq, [])
        try:
            if calls != {(c["id"], c["name"]) for c in obj["output"]["tool_calls"]}:
                return "its receipt_calls rows"
            if links != [(lk["tool_call_id"], lk["receipt_id"]) for lk in obj["links"]]:
                return "its receipt_links rows"
        except (TypeError, KeyError):
            return None  # a malformed call or link: the chain verifier names it
        return None


def _trust_note(keyring: KeyRing, pinned: bool) -> str:
    """On whose authority a passing verification of the database stands."""
    if pinned:
        return pinned_note(keyring)
    ids = ", ".join(keyring.key_ids())
    return (
        f"trusted the key(s) the database lists ({ids}): someone with write access to it"
        " could add one; pin the operator's key (callproof ledger verify --public-key) to"
        " rule that out"
    )
