"""RFC 9162 (Certificate Transparency v2) Merkle trees over a chain's entry hashes.

Leaf i (= seq - 1) is SHA-256(0x00 || entry_hash as 32 raw bytes); an inner node is
SHA-256(0x01 || left || right); the tree over n leaves splits at the largest power of two
smaller than n (section 2.1.1). Proof generation takes a `subtree(start, end)` callable giving
MTH(D[start:end]): the ledger answers it from the subtree hashes it stores (ledger_proofs), and
`MerkleTree`, an in-memory level store, from its own (the reference the tests check proofs
and the stored tree against, and what bench.merkle times). `CompactRange` is a tree's right
edge, which is all that appending needs. Verifiers raise ProofError and return None on
success.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from receipts.errors import ProofError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()  # MTH({}) (section 2.1.1)

SubtreeHasher = Callable[[int, int], bytes]
T = TypeVar("T")


def leaf_hash(entry: bytes) -> bytes:
    """MTH({d}) = SHA-256(0x00 || d); d is the 32 raw bytes of a receipt's entry hash."""
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """k, the largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def fold_subtree(
    start: int, end: int, perfect: Callable[[int, int], T], join: Callable[[T, T], T]
) -> T:
    """MTH(D[start:end]) as section 2.1.1 builds it, down to perfect subtrees: a range of 2^k
    leaves aligned on 2^k is `perfect(k, start >> k)` (the node stored at level k, index
    start >> k); any other splits at split_point, its halves `join`ed. With `join` node_hash
    it is the hash; with list concatenation, the perfect subtrees the hash is made of."""
    n = end - start
    if n & (n - 1) == 0 and start % n == 0:
        level = n.bit_length() - 1
        return perfect(level, start >> level)
    k = split_point(n)
    return join(
        fold_subtree(start, start + k, perfect, join), fold_subtree(start + k, end, perfect, join)
    )


class MerkleTree:
    """Append-only store of every perfect subtree hash: levels[k][i] = MTH of leaves
    [i*2^k, (i+1)*2^k). About 2n hashes for n leaves; any MTH(D[a:b]) costs O(log n) lookups,
    so proofs at a million leaves take microseconds instead of rehashing the tree."""

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self.levels: list[list[bytes]] = [[]]
        for h in leaf_hashes:
            self.append(h)

    @classmethod
    def from_entry_hashes(cls, entry_hashes_hex: Iterable[str]) -> MerkleTree:
        return cls(leaf_hash(bytes.fromhex(h)) for h in entry_hashes_hex)

    @property
    def size(self) -> int:
        return len(self.levels[0])

    def append(self, leaf: bytes) -> None:
        levels = self.levels
        levels[0].append(leaf)
        index, level = len(levels[0]) - 1, 0
        while index & 1:
            row = levels[level]
            parent = node_hash(row[index - 1], row[index])
            level += 1
            if level == len(levels):
                levels.append([])
            levels[level].append(parent)
            index >>= 1

    def subtree(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for 0 <= start < end <= size."""
        if not 0 <= start < end <= self.size:
            raise ValueError(f"subtree [{start}, {end}) outside a tree of size {self.size}")
        return fold_subtree(start, end, lambda level, idx: self.levels[level][idx], node_hash)

    def root(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        if not 0 <= size <= self.size:
            raise ValueError(f"no root at size {size}: the tree holds {self.size} leaves")
        return EMPTY_ROOT if size == 0 else self.subtree(0, size)

    def inclusion_proof(self, index: int, tree_size: int | None = None) -> list[bytes]:
        return inclusion_proof(index, self.size if tree_size is None else tree_size, self.subtree)

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        return consistency_proof(size1, self.size if size2 is None else size2, self.subtree)

    def compact_range(self, start: int, end: int) -> list[bytes]:
        return compact_range(start, end, self.subtree)


def inclusion_proof(index: int, tree_size: int, subtree: SubtreeHasher) -> list[bytes]:
    """PATH(index, D[tree_size]) (section 2.1.3.1), leaf level first."""
    if not 0 <= index < tree_size:
        raise ValueError(f"leaf index {index} outside a tree of size {tree_size}")
    path: list[bytes] = []
    lo, hi = 0, tree_size
    while hi - lo > 1:
        k = split_point(hi - lo)
        if index < lo + k:
            path.append(subtree(lo + k, hi))
            hi = lo + k
        else:
            path.append(subtree(lo, lo + k))
            lo += k
    path.reverse()
    return path


def consistency_proof(size1: int, size2: int, subtree: SubtreeHasher) -> list[bytes]:
    """PROOF(size1, D[size2]) (section 2.1.4.1) for 0 < size1 <= size2; empty when equal."""
    if not 0 < size1 <= size2:
        raise ValueError(f"no consistency proof from size {size1} to size {size2}")
    if size1 == size2:
        return []
    proof: list[bytes] = []
    lo, hi, m, complete = 0, size2, size1, True  # SUBPROOF(m, D[lo:hi], complete)
    while m != hi - lo:
        k = split_point(hi - lo)
        if m <= k:
            proof.append(subtree(lo + k, hi))
            hi = lo + k
        else:
            proof.append(subtree(lo, lo + k))
            lo, m, complete = lo + k, m - k, False
    if not complete:
        proof.append(subtree(lo, hi))
    proof.reverse()
    return proof


def _check_hashes(values: Sequence[bytes], what: str) -> None:
    for v in values:
        if not isinstance(v, bytes) or len(v) != HASH_SIZE:
            raise ProofError(f"{what}: every hash must be {HASH_SIZE} bytes")


def verify_inclusion(
    leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Section 2.1.3.2: raise ProofError unless `proof` shows leaf hash `leaf` at `index`
    in the tree of `tree_size` leaves whose root is `root`."""
    _check_hashes([leaf, root, *proof], "inclusion proof")
    if not 0 <= index < tree_size:
        raise ProofError(f"leaf index {index} outside a tree of size {tree_size}")
    fn, sn, r = index, tree_size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("inclusion proof is shorter than the tree is deep")
    if r != root:
        raise ProofError("inclusion proof does not lead to the root")


def verify_consistency(
    size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes
) -> None:
    """Section 2.1.4.2: raise ProofError unless the tree of size1 with root1 is a prefix of
    the tree of size2 with root2."""
    if not 0 < size1 <= size2:
        raise ProofError(f"size1 {size1} must be between 1 and size2 {size2} (RFC 9162 2.1.4.2)")
    if size1 == size2:
        if proof:
            raise ProofError("a proof between equal sizes must be empty")
        if root1 != root2:
            raise ProofError("equal sizes with different roots")
        return
    _check_hashes([root1, root2, *proof], "consistency proof")
    if not proof:
        raise ProofError("empty consistency proof between different sizes")
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # size1 is a power of two: its root is a node of the proof
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is longer than needed")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("consistency proof is shorter than needed")
    if fr != root1:
        raise ProofError("consistency proof does not lead to the first root")
    if sr != root2:
        raise ProofError("consistency proof does not lead to the second root")


def range_sizes(start: int, end: int) -> list[int]:
    """Sizes of the maximal aligned perfect subtrees that tile leaves [start, end), left to
    right (a "compact range"). The verifier derives these itself; only hashes are supplied."""
    if not 0 <= start <= end:
        raise ValueError(f"bad range [{start}, {end})")
    sizes = []
    while start < end:
        size = start & -start if start else 1 << (end.bit_length() - 1)
        while start + size > end:
            size >>= 1
        sizes.append(size)
        start += size
    return sizes


def compact_range(start: int, end: int, subtree: SubtreeHasher) -> list[bytes]:
    """The hashes of the compact range of [start, end), left to right."""
    hashes = []
    for size in range_sizes(start, end):
        hashes.append(subtree(start, start + size))
        start += size
    return hashes


class CompactRange:
    """The compact range [0, size): one perfect-subtree hash per set bit of size, largest
    first. Appending leaves or the compact range of [size, end) extends it; root() folds it.
    This lets a verifier recompute the root of a range export from the range's own leaves plus
    the hashes to its left (and right), without the rest of the chain."""

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        if size < 0 or len(hashes) != size.bit_count():
            raise ProofError(
                f"a compact range of size {size} needs {max(size, 0).bit_count()} hashes,"
                f" got {len(hashes)}"
            )
        _check_hashes(hashes, "compact range")
        self.size = size
        self.hashes = list(hashes)

    @classmethod
    def of(cls, leaf_hashes: Iterable[bytes]) -> CompactRange:
        cr = cls()
        for h in leaf_hashes:
            cr.append(h)
        return cr

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add one leaf hash; the perfect subtrees it completes, as (level, index, hash)
        with level >= 1 (what a stored tree keeps, so a verifier can compare)."""
        return self._push(1, leaf)

    def extend(self, end: int, hashes: Sequence[bytes]) -> None:
        """Append the compact range of [size, end) given its hashes (left to right)."""
        sizes = range_sizes(self.size, end)
        if len(hashes) != len(sizes):
            raise ProofError(
                f"the range [{self.size}, {end}) needs {len(sizes)} hashes, got {len(hashes)}"
            )
        _check_hashes(hashes, "compact range")
        for size, h in zip(sizes, hashes):
            self._push(size, h)

    def _push(self, size: int, h: bytes) -> list[tuple[int, int, bytes]]:
        hashes = self.hashes
        hashes.append(h)
        merged = self.size
        self.size += size
        completed = []
        while merged & size:  # the left neighbour is a perfect subtree of the same size
            right = hashes.pop()
            hashes[-1] = node_hash(hashes[-1], right)
            merged &= ~size
            size <<= 1
            level = size.bit_length() - 1  # each ends where the range now ends
            completed.append((level, (self.size >> level) - 1, hashes[-1]))
        return completed

    def root(self) -> bytes:
        """MTH of the leaves [0, size): fold the subtrees right to left."""
        if not self.hashes:
            return EMPTY_ROOT
        h = self.hashes[-1]
        for left in reversed(self.hashes[:-1]):
            h = node_hash(left, h)
        return h
