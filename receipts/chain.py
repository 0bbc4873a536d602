"""Verifying the hash chain: each receipt on its own, then the links between them.

receipts.seal makes receipts; this module only checks them. ReceiptChecker re-derives one
receipt's entry hash, signature, key range and schema binding; ChainLinker checks the links of
consecutive receipts and the Merkle root against the checkpoint, and names the first seq that
fails; verify_receipts() drives both over a sequence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Protocol

from receipts.binding import SchemaBinding, SchemaSource
from receipts.canonical import canonical_json, sha256_hex
from receipts.checkpoint import (
    check_checkpoint,
    checkpoint_problem,
    checkpoint_signature_problem,
)
from receipts.errors import (
    CanonicalizationError,
    ProofError,
    ReceiptFormatError,
    ReceiptsError,
    VerificationError,
)
from receipts.lru import Lru
from receipts.manifest import manifest_hash
from receipts.merkle import EMPTY_ROOT, CompactRange, leaf_hash, verify_consistency
from receipts.record import (
    GENESIS_PREV_HASH,
    Receipt,
)
from receipts.signing import KeyRing, decode_signature


@dataclass(frozen=True)
class VerificationReport:
    """Outcome of a verification: ok, how many receipts were checked, and when not ok the
    first failing seq (None when the failure is not a receipt's, e.g. a bad checkpoint)."""

    ok: bool
    checked: int
    first_failure_seq: int | None = None
    reason: str | None = None
    chain: str | None = None
    tree_size: int | None = None
    root_hash: str | None = None
    notes: tuple[str, ...] = ()  # caveats of the report (e.g. which keys were trusted)
    first_seq: int | None = None  # the seqs checked, first_seq..last_seq of tree_size
    last_seq: int | None = None

    @property
    def whole_chain(self) -> bool:
        """Whether the receipts checked are every one the checkpoint signs (seq 1..tree_size)."""
        return self.first_seq == 1 and self.last_seq == self.tree_size

    @classmethod
    def failed(
        cls,
        reason: str,
        *,
        seq: int | None = None,
        checked: int = 0,
        chain: str | None = None,
        notes: tuple[str, ...] = (),
    ) -> VerificationReport:
        """A failure at receipt `seq` (None: not one receipt's) after `checked` passed."""
        return cls(
            ok=False,
            checked=checked,
            first_failure_seq=seq,
            reason=reason,
            chain=chain,
            notes=notes,
        )

    def to_json_obj(self) -> dict[str, Any]:
        return asdict(self)


MANIFEST_MEMO = 1024  # distinct manifests whose hash a ReceiptChecker remembers


class ReceiptChecker:
    """The checks one receipt must pass on its own: entry hash, signing key and range,
    signature, manifest hash, schema binding. Manifest hashes are memoised per run (a chain
    repeats a few manifests many times), keyed by a digest of their JSON text and forgetting
    the least recently used: a bundle of distinct large manifests must not all stay in memory."""

    def __init__(self, keyring: KeyRing, schemas: SchemaSource) -> None:
        self.keyring = keyring
        self.binding = SchemaBinding(schemas)
        self._manifest_hashes: Lru[str, str] = Lru(MANIFEST_MEMO)

    def problem(self, receipt: Receipt, canonical_body: bytes | None = None) -> str | None:
        """The first reason `receipt` fails, or None. `canonical_body`, when the caller
        already has it (canonical.loads_plain), saves canonicalizing the body again."""
        try:
            if canonical_body is None:
                canonical_body = canonical_json(receipt.body())
        except CanonicalizationError as exc:
            return str(exc)
        if sha256_hex(canonical_body) != receipt.entry_hash:
            return "entry_hash does not match the receipt's content (edited)"
        keyring = self.keyring
        if receipt.key_id not in keyring:
            return f"signed by unknown key {receipt.key_id}"
        if not keyring.allows(receipt.key_id, receipt.chain, receipt.seq):
            return (
                f"key {receipt.key_id} did not sign seq {receipt.seq} of chain"
                f" {receipt.chain!a} (out of range)"
            )
        signature = decode_signature(receipt.signature)
        if signature is None:
            return "signature is not 64 bytes in canonical base64"
        if not keyring.verify(receipt.key_id, bytes.fromhex(receipt.entry_hash), signature):
            return "signature does not verify"
        if self._manifest_hash(receipt.manifest) != receipt.manifest_hash:
            return "manifest_hash does not match the manifest"
        return self.binding.problem(receipt.manifest, receipt.output, receipt.validation)

    def _manifest_hash(self, manifest: Mapping[str, Any]) -> str:
        # equal text -> equal JSON -> equal hash; json.dumps is C, JCS (floats) is not
        key = sha256_hex(json.dumps(manifest, sort_keys=True).encode("ascii"))
        return self._manifest_hashes.get(key, lambda _: manifest_hash(manifest))


class Linkable(Protocol):
    """What linking needs of a receipt (a Receipt, or the facts a worker process returns)."""

    chain: str
    seq: int
    prev_hash: str
    entry_hash: str


class LinkedRun(NamedTuple):
    """Consecutive receipts that passed their own checks and link among themselves: what
    the chain linker needs of them (count 0: none did)."""

    chain: str
    seq: int  # of the first receipt
    prev_hash: str  # of the first receipt
    entry_hash: str  # of the last receipt
    count: int
    leaves: bytes  # the Merkle leaf hash of each receipt, 32 bytes apiece, in order

    @classmethod
    def of(cls, receipt: Linkable) -> LinkedRun:
        entry = receipt.entry_hash
        leaf = leaf_hash(bytes.fromhex(entry))
        return cls(receipt.chain, receipt.seq, receipt.prev_hash, entry, 1, leaf)


def link_problem(chain: str | None, seq: int, prev_hash: str, receipt: Linkable) -> str | None:
    """Why `receipt` cannot be seq `seq` of chain `chain` (None: any chain) after a receipt
    whose entry hash is `prev_hash`, or None when it links."""
    if chain is not None and receipt.chain != chain:
        return f"receipt of chain {receipt.chain!r} in chain {chain!r}"
    if receipt.seq != seq:
        return (
            f"expected seq {seq}, found seq {receipt.seq}"
            " (a receipt is missing, reordered or inserted)"
        )
    if receipt.prev_hash != prev_hash:
        return "prev_hash does not link to the previous receipt's entry_hash"
    return None


class ChainLinker:
    """The sequential part of verification: gapless seqs, prev_hash links, one chain, and the
    Merkle root checked against a signed checkpoint once the tree reaches its size.

    `left` is the compact range of the leaves before `start_seq` (empty from seq 1), which
    lets a range of the chain be checked against a checkpoint of the whole chain.

    `saved` are checkpoints the verifier kept from earlier: the tree must pass through each
    one's signed root at its size (the chain only grew since; RFC 9162 section 2.1.4's
    consistency, checked here from the leaves themselves).

    `consistency` holds RFC 9162 consistency proofs, keyed by (size1, size2), for a saved
    checkpoint whose size the receipts do not reach: one before the first receipt checked is
    proved a prefix of the tree at ``start_seq - 1`` (the `left` root), one past the last is
    proved to extend the tree at the last receipt. A verifier holding the whole stored tree
    can make them for any range; a bundle cannot, so without one such a checkpoint fails as
    before (it predates the range, or the receipts were cut back since).
    """

    def __init__(
        self,
        keyring: KeyRing,
        *,
        chain: str | None = None,
        expected_prev_hash: str = GENESIS_PREV_HASH,
        start_seq: int = 1,
        checkpoint: Mapping[str, Any] | None = None,
        left: list[bytes] | None = None,
        saved: Sequence[Mapping[str, Any]] = (),
        consistency: Mapping[tuple[int, int], Sequence[bytes]] | None = None,
    ) -> None:
        if start_seq == 1 and expected_prev_hash != GENESIS_PREV_HASH:
            raise VerificationError("seq 1 must follow the genesis prev_hash (64 zeros)")
        anchors = [*([checkpoint] if checkpoint is not None else []), *saved]
        for cp in anchors:
            try:
                check_checkpoint(cp)
            except ReceiptFormatError as exc:
                raise VerificationError(str(exc)) from exc
        self.chain = chain if chain is not None or checkpoint is None else checkpoint["chain"]
        self.start_seq = start_seq
        self.next_seq = start_seq
        self.prev_hash = expected_prev_hash
        self.checkpoint = checkpoint
        self.keyring = keyring
        self.checked = 0
        self.root_checked = False
        self.saved = sorted(saved, key=lambda cp: cp["tree_size"])
        self._consistency = consistency or {}
        # The Merkle tree only matters against a checkpoint; without one, skip its hashing.
        self.tree = CompactRange(start_seq - 1, left or []) if anchors else None
        self._hash_until = max((cp["tree_size"] for cp in anchors), default=0)
        if checkpoint is not None and checkpoint["tree_size"] < start_seq - 1:
            raise VerificationError("checkpoint predates the first receipt checked")
        while self.saved and self.saved[0]["tree_size"] < start_seq - 1:
            cp = self.saved.pop(0)
            if (cp["tree_size"], start_seq - 1) not in self._consistency:
                raise VerificationError(
                    f"the saved checkpoint of tree size {cp['tree_size']} predates the"
                    " first receipt checked: verify a bundle of the whole chain against it"
                )
            self._check_consistent(cp, start_seq - 1)
        self._reached(start_seq - 1, None)

    def link(self, receipt: Linkable) -> None:
        """Accept the next receipt, or raise VerificationError at the seq where it breaks."""
        self.link_run(LinkedRun.of(receipt))

    def link_run(self, run: LinkedRun) -> None:
        """Accept a run of receipts already linked among themselves (by a worker process):
        its first receipt must follow the last one accepted. Raises at the seq that breaks."""
        if not run.count:
            return
        problem = link_problem(self.chain, self.next_seq, self.prev_hash, run)
        if problem:
            raise VerificationError(problem, self.next_seq)
        self.chain = run.chain
        self.prev_hash = run.entry_hash
        self.next_seq += run.count
        self.checked += run.count
        tree = self.tree
        if tree is None:
            return
        leaves = run.leaves
        for offset in range(0, min(len(leaves), (self._hash_until - tree.size) * 32), 32):
            tree.append(leaves[offset : offset + 32])
            self._reached(tree.size, tree.size)  # seq tree.size completed this tree

    def _reached(self, size: int, seq: int | None) -> None:
        """The tree has ``size`` leaves: check each checkpoint of that size."""
        while self.saved and self.saved[0]["tree_size"] == size:
            self._check_against(self.saved.pop(0), seq, "saved checkpoint")
        cp = self.checkpoint
        if cp is not None and not self.root_checked and cp["tree_size"] == size:
            self._check_root(seq)

    def finish(self, right: list[bytes] | None = None) -> None:
        """End of input: the checkpoint must have been reached (or be reachable through the
        compact range `right` of the leaves after the last receipt, for a range export)."""
        last = self.next_seq - 1
        while self.saved and (last, self.saved[0]["tree_size"]) in self._consistency:
            self._check_consistent(self.saved.pop(0), last)
        if self.saved:
            self._check_truncation(self.saved[0])
        cp = self.checkpoint
        if cp is None or self.root_checked:
            if right:
                raise VerificationError(
                    "proofs.json holds hashes after the last receipt, which already reaches"
                    " the checkpoint"
                )
            return
        size = cp["tree_size"]
        if not right:
            raise VerificationError(
                f"the signed checkpoint covers {size} receipts but only"
                f" {self.next_seq - 1} are present (truncated)",
                self.next_seq,
            )
        self.tree.extend(size, right)
        self._check_root(None)

    def _check_root(self, seq: int | None) -> None:
        """Compare roots once the tree reaches the checkpoint. The checkpoint's own signature
        is checked here, not up front, so a receipt failing earlier is what gets reported."""
        self.root_checked = True
        self._check_against(self.checkpoint, seq, "signed checkpoint")

    def _check_against(self, cp: Mapping[str, Any], seq: int | None, what: str) -> None:
        self._check_trusted(cp, what)
        if self.tree.root().hex() != cp["root_hash"]:
            raise VerificationError(
                f"Merkle root at tree size {self.tree.size} does not match the {what}", seq
            )

    def _check_truncation(self, cp: Mapping[str, Any]) -> None:
        """A saved checkpoint past the last receipt: the chain was cut since it was saved, if
        the checkpoint is this chain's and its signature holds (a forged or foreign one's size
        claims nothing). Its key may be gone with the receipts it signed: then it is named,
        and the signature is left unchecked; its recorded turns, gone too, are not asked."""
        self._check_chain(cp, "saved checkpoint")
        size, known = cp["tree_size"], cp["key_id"] in self.keyring
        problem = checkpoint_signature_problem(cp, self.keyring) if known else None
        if problem is not None:
            raise VerificationError(f"saved checkpoint at tree size {size}: {problem}")
        unchecked = (
            ""
            if known
            else f"; its key {cp['key_id']} is not among the keys given, so its signature is"
            " unchecked"
        )
        raise VerificationError(
            f"a saved checkpoint covers {size} receipts but only {self.next_seq - 1} are"
            f" present (truncated since it was saved){unchecked}",
            self.next_seq,
        )

    def _check_chain(self, cp: Mapping[str, Any], what: str) -> None:
        if cp["chain"] != self.chain:
            raise VerificationError(f"{what} is for chain {cp['chain']!r}, not {self.chain!r}")

    def _check_trusted(self, cp: Mapping[str, Any], what: str) -> None:
        """The checkpoint is of this chain and signed by a key trusted for it. The chain comes
        first: the key's turns are recorded per chain, so a checkpoint of another chain
        would otherwise read as signed by a retired key."""
        self._check_chain(cp, what)
        reason = checkpoint_problem(cp, self.keyring)
        if reason:
            raise VerificationError(f"{what} at tree size {cp['tree_size']}: {reason}")

    def _check_consistent(self, cp: Mapping[str, Any], size: int) -> None:
        """Check saved checkpoint ``cp`` against the tree as it stands at ``size`` (the edge
        of the receipts nearest it) through the consistency proof between the two sizes."""
        what = "saved checkpoint"
        self._check_trusted(cp, what)
        saved_size, saved_root = cp["tree_size"], bytes.fromhex(cp["root_hash"])
        mine = self.tree.root()
        size1, size2 = sorted((saved_size, size))
        root1, root2 = (saved_root, mine) if saved_size == size1 else (mine, saved_root)
        proof = list(self._consistency[(size1, size2)])
        try:
            if size1:
                verify_consistency(size1, size2, proof, root1, root2)
            elif proof or root1 != EMPTY_ROOT:  # the empty tree is a prefix of every tree
                raise ProofError("the empty tree's root is SHA-256 of nothing, its proof empty")
        except ProofError as exc:
            raise VerificationError(
                f"{what} at tree size {saved_size}: the Merkle tree at tree size {size}"
                f" does not extend it or is not extended by it ({exc.reason})"
            ) from None

    def report(self) -> VerificationReport:
        cp = self.checkpoint
        return VerificationReport(
            ok=True,
            checked=self.checked,
            chain=self.chain,
            tree_size=cp["tree_size"] if cp else None,
            root_hash=cp["root_hash"] if cp else None,
            first_seq=self.start_seq if self.checked else None,
            last_seq=self.next_seq - 1 if self.checked else None,
        )


def saved_checkpoints_note(saved: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """What a passing report says of the checkpoints the verifier kept (none: nothing):
    that the chain still passes through each one's root, so it was neither rewritten nor cut
    back since."""
    if not saved:
        return ()
    sizes = ", ".join(str(cp["tree_size"]) for cp in saved)
    return (f"the receipts pass through the root of each saved checkpoint (tree size {sizes})",)


def verify_receipts(
    receipts: Iterable[Receipt | Mapping[str, Any]],
    keyring: KeyRing,
    *,
    expected_prev_hash: str = GENESIS_PREV_HASH,
    start_seq: int = 1,
    schemas: SchemaSource,
    checkpoint: Mapping[str, Any] | None = None,
    left: list[bytes] | None = None,
    right: list[bytes] | None = None,
    saved: Sequence[Mapping[str, Any]] = (),
    consistency: Mapping[tuple[int, int], Sequence[bytes]] | None = None,
    chain: str | None = None,
) -> VerificationReport:
    """Verify a run of one chain's receipts in seq order, starting at `start_seq` after
    `expected_prev_hash`; receipts may be Receipt objects or raw JSON objects (a malformed one
    fails at its seq). Stops at the first failure. With `checkpoint`, the Merkle root over the
    entry hashes must equal its signed root and a checkpoint beyond the last receipt means a
    truncated tail; `left`/`right` are compact ranges for a range that is not the whole tree.
    `saved` and `consistency` are as ChainLinker takes them; `chain`, when the caller knows
    it, is the chain every receipt and checkpoint must be of.
    """
    checker = ReceiptChecker(keyring, schemas)
    try:
        linker = ChainLinker(
            keyring,
            chain=chain,
            expected_prev_hash=expected_prev_hash,
            start_seq=start_seq,
            checkpoint=checkpoint,
            left=left,
            saved=saved,
            consistency=consistency,
        )
    except ReceiptsError as exc:  # a malformed checkpoint or left compact range
        return VerificationReport.failed(getattr(exc, "reason", str(exc)))
    try:
        for item in receipts:
            seq = linker.next_seq
            try:
                receipt = item if isinstance(item, Receipt) else Receipt.from_json_obj(item)
            except ReceiptFormatError as exc:
                raise VerificationError(f"malformed receipt: {exc}", seq) from exc
            reason = checker.problem(receipt)
            if reason:
                raise VerificationError(reason, seq)
            linker.link(receipt)
        linker.finish(right)
    except VerificationError as exc:  # includes ProofError from a malformed right range
        return VerificationReport.failed(
            exc.reason, seq=exc.seq, checked=linker.checked, chain=linker.chain
        )
    return linker.report()
