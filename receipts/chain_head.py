"""A chain's head as the ledger writer holds it: entry hash, signing key, last checkpoint,
and the Merkle tree's right edge (a compact range, stored as the row's ``frontier``), advanced
in memory while a batch is sealed onto it, so a batch extends the tree and signs checkpoints
without reading any earlier receipt back."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from receipts.merkle import CompactRange, leaf_hash


@dataclass
class ChainHead:
    """A chain's locked head row, advanced in memory while a batch is sealed onto it."""

    chain: str
    hash: str
    tree: CompactRange
    """The Merkle tree of the chain's receipts as its right edge: its size is the head's seq."""
    key_id: str | None
    checkpoint_size: int
    checkpoint_at: int  # epoch milliseconds of the chain's last checkpoint
    new_nodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sealed_onto: tuple[int, str] = dataclasses.field(init=False)
    """The seq and entry hash this head was read or kept at: the stored head must still be
    that when the row is written (append_sql's compare-and-set), or another writer or a
    restore moved it."""
    stale_checkpoint: bool = False
    """The checkpoint columns come from the writer's own last commit, not a locked read:
    another process may have signed a checkpoint since, so they are not written back."""

    def __post_init__(self) -> None:
        self.sealed_onto = (self.tree.size, self.hash)

    @property
    def seq(self) -> int:
        return self.tree.size

    def kept(self) -> ChainHead:
        """A copy to seal the writer's next batch onto without re-reading the row."""
        tree = CompactRange(self.tree.size, self.tree.hashes)
        return dataclasses.replace(self, tree=tree, new_nodes=[], stale_checkpoint=True)

    def add_leaf(self, entry_hash: str) -> None:
        """Extend the tree by one leaf, recording each perfect subtree the leaf completes
        (merkle_nodes rows)."""
        for level, idx, node in self.tree.append(leaf_hash(bytes.fromhex(entry_hash))):
            self.new_nodes.append({"chain": self.chain, "level": level, "idx": idx, "hash": node})
        self.hash = entry_hash

    def root(self) -> str:
        return self.tree.root().hex()

    def row(self) -> dict[str, Any]:
        """The chains row (or, with a stale checkpoint, the part of it) to record."""
        row = {
            "chain": self.chain,
            "head_seq": self.seq,
            "head_hash": self.hash,
            "frontier": ",".join(h.hex() for h in self.tree.hashes),
            "key_id": self.key_id,
            "b_from": self.sealed_onto[0],
            "b_from_hash": self.sealed_onto[1],
        }
        if not self.stale_checkpoint:
            row["checkpoint_size"] = self.checkpoint_size
            row["checkpoint_at"] = self.checkpoint_at
        return row
