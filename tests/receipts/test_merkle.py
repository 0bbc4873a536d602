"""RFC 9162 Merkle proofs: the transparency-dev test vectors and hypothesis properties."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receipts.errors import ProofError
from receipts.merkle import (
    EMPTY_ROOT,
    CompactRange,
    MerkleTree,
    leaf_hash,
    node_hash,
    split_point,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "testdata" / "merkle"


def _cases(kind: str) -> list[Path]:
    return sorted((VECTORS / kind).rglob("*.json"))


def _b64(value: str | None) -> bytes:
    return base64.b64decode(value or "")


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(VECTORS)) for p in paths]


def _is_rfc9162(path: Path) -> bool:
    case = json.loads(path.read_text())
    return case["start"] == 0 and case["end"] > 0


def _expect(want_err: bool, verify: Callable[..., None], *args: object) -> None:
    if want_err:
        with pytest.raises(ProofError):
            verify(*args)
    else:
        verify(*args)


INCLUSION = _cases("inclusion")
CONSISTENCY = _cases("consistency")


def test_vectors_are_present() -> None:
    # a silently empty glob would pass nothing
    assert len(INCLUSION) > 50 and len(CONSISTENCY) > 50
    assert len(SUBTREE_INCLUSION) > 50 and len(SUBTREE_CONSISTENCY) > 50


# The subtree* vectors test the subtree proofs of the Merkle Tree Certificates draft (proofs
# about a node-aligned subtree [start, end) of a tree, and "an empty subtree is consistent with
# anything"): an extension beyond RFC 9162 that callproof neither offers nor needs (range
# exports use compact ranges). A subtree that starts at 0 and is not empty is an ordinary
# RFC 9162 tree of size `end`, so those cases must pass the RFC 9162 verifiers as they are.
SUBTREE_INCLUSION = [p for p in _cases("subtreeinclusion") if _is_rfc9162(p)]
SUBTREE_CONSISTENCY = [p for p in _cases("subtreeconsistency") if _is_rfc9162(p)]


@pytest.mark.parametrize(
    "path", INCLUSION + SUBTREE_INCLUSION, ids=_ids(INCLUSION + SUBTREE_INCLUSION)
)
def test_inclusion_vectors(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (
        _b64(case["leafHash"]),
        case["leafIdx"],
        case.get("treeSize", case.get("end")),
        [_b64(p) for p in case["proof"] or []],
        _b64(case["root"]),
    )
    _expect(case["wantErr"], verify_inclusion, *args)


@pytest.mark.parametrize(
    "path", CONSISTENCY + SUBTREE_CONSISTENCY, ids=_ids(CONSISTENCY + SUBTREE_CONSISTENCY)
)
def test_consistency_vectors(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (
        case.get("size1", case.get("end")),
        case.get("size2", case.get("size")),
        [_b64(p) for p in case["proof"] or []],
        _b64(case["root1"]),
        _b64(case["root2"]),
    )
    _expect(case["wantErr"], verify_consistency, *args)


def _reference_root(leaves: list[bytes]) -> bytes:
    """MTH straight from RFC 9162 section 2.1.1, recursively, as an independent oracle."""
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = split_point(len(leaves))
    return node_hash(_reference_root(leaves[:k]), _reference_root(leaves[k:]))


def _leaves(n: int) -> list[bytes]:
    return [leaf_hash(hashlib.sha256(i.to_bytes(8, "big")).digest()) for i in range(n)]


BIG = 4133  # 2**12 + 37: deep enough that every proof shape occurs
BIG_LEAVES = _leaves(BIG)
BIG_TREE = MerkleTree(BIG_LEAVES)
sizes = st.one_of(st.integers(min_value=1, max_value=70), st.integers(min_value=1, max_value=BIG))


def test_known_root_of_rfc6962_test_tree() -> None:
    # The 8-leaf tree of the certificate-transparency reference tests (leaf data below).
    data = [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
    leaves = [hashlib.sha256(b"\x00" + bytes.fromhex(d)).digest() for d in data]
    assert CompactRange.of(leaves).root().hex() == (
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"
    )


@settings(max_examples=200, deadline=None)
@given(data=st.data(), tree_size=sizes)
def test_inclusion_proofs_verify_and_bind(data: st.DataObject, tree_size: int) -> None:
    leaves, tree = BIG_LEAVES, BIG_TREE
    index = data.draw(st.integers(min_value=0, max_value=tree_size - 1))
    root = _reference_root(leaves[:tree_size])
    assert tree.root(tree_size) == root
    proof = tree.inclusion_proof(index, tree_size)
    verify_inclusion(leaves[index], index, tree_size, proof, root)
    # any other leaf, index or a flipped proof byte must fail
    other = data.draw(st.integers(min_value=0, max_value=tree_size - 1))
    if other != index:
        with pytest.raises(ProofError):
            verify_inclusion(leaves[other], index, tree_size, proof, root)
        with pytest.raises(ProofError):
            verify_inclusion(leaves[index], other, tree_size, proof, root)
    if proof:
        at = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
        bad = list(proof)
        bad[at] = bytes([bad[at][0] ^ 1]) + bad[at][1:]
        with pytest.raises(ProofError):
            verify_inclusion(leaves[index], index, tree_size, bad, root)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), size2=sizes)
def test_consistency_proofs_verify_and_bind(data: st.DataObject, size2: int) -> None:
    leaves, tree = BIG_LEAVES, BIG_TREE
    size1 = data.draw(st.integers(min_value=1, max_value=size2))
    root1, root2 = _reference_root(leaves[:size1]), _reference_root(leaves[:size2])
    proof = tree.consistency_proof(size1, size2)
    verify_consistency(size1, size2, proof, root1, root2)
    if size1 < size2:
        forked = leaves[: size2 - 1] + [leaf_hash(b"forged")]
        with pytest.raises(ProofError):
            verify_consistency(size1, size2, proof, root1, _reference_root(forked))
        with pytest.raises(ProofError):
            verify_consistency(size1, size2, proof[:-1], root1, root2)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), size=st.integers(min_value=1, max_value=300))
def test_compact_ranges_rebuild_the_root_of_a_range(data: st.DataObject, size: int) -> None:
    """What a range export relies on: left hashes + the range's leaves + right hashes give
    the checkpointed root, and only the exact leaves do."""
    leaves, tree = BIG_LEAVES[:size], MerkleTree(BIG_LEAVES[:size])
    end = data.draw(st.integers(min_value=1, max_value=size))
    start = data.draw(st.integers(min_value=0, max_value=end - 1))
    rng = CompactRange(start, tree.compact_range(0, start))
    for leaf in leaves[start:end]:
        rng.append(leaf)
    rng.extend(size, tree.compact_range(end, size))
    assert rng.root() == _reference_root(leaves)
    short = CompactRange(start, tree.compact_range(0, start))
    for leaf in leaves[start : end - 1]:  # the range's last leaf withheld
        short.append(leaf)
    try:
        short.extend(size, tree.compact_range(end, size))
    except ProofError:
        return  # the right-hand hashes no longer fit the range's shape
    assert short.root() != rng.root()


def test_bad_arguments_are_typed_errors() -> None:
    tree = MerkleTree(_leaves(5))
    with pytest.raises(ValueError):
        tree.inclusion_proof(5)
    with pytest.raises(ValueError):
        tree.consistency_proof(0, 5)
    with pytest.raises(ProofError):
        verify_inclusion(b"short", 0, 1, [], EMPTY_ROOT)
    with pytest.raises(ProofError):
        CompactRange(3, [EMPTY_ROOT])  # size 3 needs two subtree hashes


# What a mutation review found no test pinned.


def _salted_leaves(n: int, salt: bytes = b"") -> list[bytes]:
    return [leaf_hash(hashlib.sha256(salt + i.to_bytes(8, "big")).digest()) for i in range(n)]


@pytest.mark.parametrize(("size1", "size2"), [(3, 7), (5, 8), (6, 13), (7, 8)])
def test_a_consistency_proof_binds_the_first_root(size1: int, size2: int) -> None:
    """For a first size that is not a power of two the proof rebuilds the first root too
    (RFC 9162 section 2.1.4.2); another history's root at that size fails."""
    tree = MerkleTree(_salted_leaves(size2))
    forked = MerkleTree(_salted_leaves(size1, b"forked"))
    proof = tree.consistency_proof(size1, size2)
    verify_consistency(size1, size2, proof, tree.root(size1), tree.root())
    with pytest.raises(ProofError):
        verify_consistency(size1, size2, proof, forked.root(), tree.root())


def test_a_compact_range_takes_exactly_its_hashes() -> None:
    """An extra hash on a range's right edge is refused, not ignored."""
    tree = MerkleTree(_salted_leaves(10))
    left = CompactRange(4, tree.compact_range(0, 4))
    with pytest.raises(ProofError):
        left.extend(10, [*tree.compact_range(4, 10), b"\x00" * 32])
    edge = tree.compact_range(4, 10)
    split = [edge[0][:31], edge[1][:0] + edge[0][31:] + edge[1], *edge[2:]]  # same bytes
    with pytest.raises(ProofError):
        CompactRange(4, tree.compact_range(0, 4)).extend(10, split)
