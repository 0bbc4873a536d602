"""RFC 9162 inclusion and consistency proofs for a stored chain, built from the receipts'
entry hashes and the completed subtree hashes the writer stores (``merkle_nodes``), so a
proof at any tree size reads O(log n) rows."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

import sqlalchemy as sa

from receipts import merkle, queries
from receipts.checkpoint import Checkpoint
from receipts.errors import ChainDamaged, OutOfRange
from receipts.merkle import SubtreeHasher, fold_subtree, leaf_hash, node_hash
from receipts.store import MerkleNodeRow, ReceiptRow


class InclusionProof(TypedDict):
    """RFC 9162 section 2.1.3: `proof` (hex, from the leaf's level up) takes the leaf hash of
    `entry_hash` at `leaf_index` to `root_hash` of the tree of `tree_size` leaves, which
    `checkpoint` signs when one was made at that size (else null)."""

    chain: str
    seq: int
    leaf_index: int
    tree_size: int
    entry_hash: str
    proof: list[str]
    root_hash: str
    checkpoint: Checkpoint | None


class ConsistencyProof(TypedDict):
    """RFC 9162 section 2.1.4: `proof` (hex) shows the tree of `size1` leaves (root `root1`)
    is a prefix of the tree of `size2` (root `root2`, signed by `checkpoint` when one was
    made at that size, else null)."""

    chain: str
    size1: int
    size2: int
    root1: str
    root2: str
    proof: list[str]
    checkpoint: Checkpoint | None


def inclusion_proof(
    conn: sa.Connection, tenant: str, seq: int, tree_size: int | None = None
) -> InclusionProof:
    """Inclusion proof of receipt ``seq`` in the tree of ``tree_size`` leaves (default: the
    latest checkpoint's, which is included so the root is signed)."""
    checkpoint, tree_size = _proof_target(conn, tenant, tree_size)
    if not 1 <= seq <= tree_size:
        raise OutOfRange(f"seq {seq} is outside the tree of size {tree_size}")
    proof, root = with_stored_tree(
        conn,
        tenant,
        lambda subtree: (
            merkle.inclusion_proof(seq - 1, tree_size, subtree),
            subtree(0, tree_size),
        ),
    )
    entry_hash = queries.entry_hash(conn, tenant, seq)
    if entry_hash is None:
        raise ChainDamaged(f"chain {tenant!r}: receipt seq {seq} is missing")
    return {
        "chain": tenant,
        "seq": seq,
        "leaf_index": seq - 1,
        "tree_size": tree_size,
        "entry_hash": entry_hash,
        "proof": [h.hex() for h in proof],
        "root_hash": root.hex(),
        "checkpoint": checkpoint,
    }


def consistency_proof(
    conn: sa.Connection, tenant: str, size1: int, size2: int | None = None
) -> ConsistencyProof:
    """Consistency proof that the tree of ``size1`` leaves is a prefix of the tree of
    ``size2`` (default: the latest checkpoint's size)."""
    checkpoint, size2 = _proof_target(conn, tenant, size2)
    if not 1 <= size1 <= size2:
        raise OutOfRange(f"need 1 <= size1 <= size2, got {size1} and {size2}")
    proof, root1, root2 = with_stored_tree(
        conn,
        tenant,
        lambda subtree: (
            merkle.consistency_proof(size1, size2, subtree),
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
    conn: sa.Connection, tenant: str, tree_size: int | None
) -> tuple[dict[str, Any] | None, int]:
    """The tree size a proof is made against (default: the latest checkpoint's, else the
    head) and the signed checkpoint at that size, if one was stored."""
    if tree_size is None:
        checkpoint = queries.latest_checkpoint(conn, tenant)
        if checkpoint is not None:
            return checkpoint, checkpoint["tree_size"]
    head = queries.head_row(conn, tenant)
    head_seq = head.head_seq if head else 0
    size = head_seq if tree_size is None else tree_size
    if head_seq == 0:
        raise OutOfRange(f"chain {tenant!r} has no receipts yet: nothing to prove")
    if not 1 <= size <= head_seq:
        raise OutOfRange(f"tree size {size} is outside chain {tenant!r} (1..{head_seq})")
    return queries.checkpoint_at(conn, tenant, size), size


T = TypeVar("T")


def with_stored_tree(conn: sa.Connection, tenant: str, build: Callable[[SubtreeHasher], T]) -> T:
    """Run a receipts.merkle proof builder (``build(subtree) -> result``) on the stored tree.

    A dry run records which subtrees the builder asks for; their perfect pieces (level 0:
    entry hashes, level >= 1: merkle_nodes) are fetched in two queries; the real run folds
    them. So a proof at a million leaves costs O(log^2 n) small row reads, not a tree rebuild.
    """
    asked: list[tuple[int, int]] = []
    build(lambda start, end: asked.append((start, end)) or bytes(32))
    wanted = {piece for span in set(asked) for piece in _pieces(*span)}
    hashes = _leaf_pieces(conn, tenant, [idx for level, idx in wanted if level == 0])
    hashes |= _node_pieces(conn, tenant, [piece for piece in wanted if piece[0] > 0])
    missing = wanted - hashes.keys()
    if missing:
        level, idx = min(missing)
        raise ChainDamaged(
            f"chain {tenant!r}: stored Merkle tree lacks the subtree at level"
            f" {level}, index {idx} (seq {idx * 2**level + 1} onwards)"
        )

    def subtree(start: int, end: int) -> bytes:
        return fold_subtree(start, end, lambda level, idx: hashes[(level, idx)], node_hash)

    return build(subtree)


def _pieces(start: int, end: int) -> list[tuple[int, int]]:
    """(level, idx) of the stored perfect subtrees MTH(D[start:end]) is made of."""
    return fold_subtree(start, end, lambda level, idx: [(level, idx)], operator.add)


def _leaf_pieces(
    conn: sa.Connection, tenant: str, indexes: list[int]
) -> dict[tuple[int, int], bytes]:
    r = ReceiptRow.__table__.c
    found: dict[tuple[int, int], bytes] = {}
    for chunk in queries.chunks(sorted(indexes)):
        rows = conn.execute(
            sa.select(r.seq, r.entry_hash).where(
                r.chain == tenant, r.seq.in_([i + 1 for i in chunk])
            )
        )
        found |= {(0, row.seq - 1): leaf_hash(bytes.fromhex(row.entry_hash)) for row in rows}
    return found


def _node_pieces(
    conn: sa.Connection, tenant: str, nodes: list[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    m = MerkleNodeRow.__table__.c
    found: dict[tuple[int, int], bytes] = {}
    for chunk in queries.chunks(sorted(nodes)):
        rows = conn.execute(
            sa.select(m.level, m.idx, m.hash).where(
                m.chain == tenant, sa.tuple_(m.level, m.idx).in_(chunk)
            )
        )
        found |= {(row.level, row.idx): bytes(row.hash) for row in rows}
    return found
