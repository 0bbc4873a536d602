"""Merkle proof time at a million receipts (goal: <= 5 ms per inclusion or consistency proof).

    python -m bench.merkle [--size 1000000] [--samples 2000]

Builds receipts.merkle.MerkleTree (the level store: every perfect-subtree hash kept, about 2n
hashes) over `size` random entry hashes, then times proof generation and verification for
random leaves and random earlier sizes against the full tree. The baseline, measured in the
same run, is what a store without levels must do: rebuild the subtree hashes the proof needs
from the leaves (RFC 9162 MTH over the raw leaf hashes), once per proof kind.

The last line of output is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable

from bench.measure import percentile
from receipts.merkle import (
    MerkleTree,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    split_point,
    verify_consistency,
    verify_inclusion,
)


def _levelless_subtree(leaves: list[bytes]) -> Callable[[int, int], bytes]:
    """MTH(D[start:end]) recomputed from the leaf hashes every time (no stored levels)."""

    def subtree(start: int, end: int) -> bytes:
        if end - start == 1:
            return leaves[start]
        k = split_point(end - start)
        return node_hash(subtree(start, start + k), subtree(start + k, end))

    return subtree


def _ms(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples, 50) * 1e3, 4),
        "p99_ms": round(percentile(samples, 99) * 1e3, 4),
        "max_ms": round(max(samples) * 1e3, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.merkle", description=__doc__)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args(argv)
    rng = random.Random(9162)
    size = args.size

    started = time.perf_counter()
    leaves = [leaf_hash(os.urandom(32)) for _ in range(size)]
    tree = MerkleTree(leaves)
    build_s = time.perf_counter() - started
    root = tree.root()
    print(f"built a {size}-leaf level store in {build_s:.2f} s")

    gen_incl, ver_incl, gen_cons, ver_cons = [], [], [], []
    for _ in range(args.samples):
        index = rng.randrange(size)
        t0 = time.perf_counter()
        proof = tree.inclusion_proof(index)
        t1 = time.perf_counter()
        verify_inclusion(leaves[index], index, size, proof, root)
        t2 = time.perf_counter()
        gen_incl.append(t1 - t0)
        ver_incl.append(t2 - t1)

        size1 = rng.randrange(1, size)
        root1 = tree.root(size1)
        t0 = time.perf_counter()
        proof = tree.consistency_proof(size1)
        t1 = time.perf_counter()
        verify_consistency(size1, size, proof, root1, root)
        t2 = time.perf_counter()
        gen_cons.append(t1 - t0)
        ver_cons.append(t2 - t1)

    levelless = _levelless_subtree(leaves)
    index, size1 = rng.randrange(size), rng.randrange(1, size)
    t0 = time.perf_counter()
    assert inclusion_proof(index, size, levelless) == tree.inclusion_proof(index)
    t1 = time.perf_counter()
    assert consistency_proof(size1, size, levelless) == tree.consistency_proof(size1)
    t2 = time.perf_counter()
    baseline_incl, baseline_cons = t1 - t0, t2 - t1

    incl = {"generate": _ms(gen_incl), "verify": _ms(ver_incl)}
    cons = {"generate": _ms(gen_cons), "verify": _ms(ver_cons)}
    print(
        f"inclusion   generate p50 {incl['generate']['p50_ms']} ms, verify p50"
        f" {incl['verify']['p50_ms']} ms; without levels {baseline_incl * 1e3:.0f} ms"
    )
    print(
        f"consistency generate p50 {cons['generate']['p50_ms']} ms, verify p50"
        f" {cons['verify']['p50_ms']} ms; without levels {baseline_cons * 1e3:.0f} ms"
    )
    figures = {
        "tree_size": size,
        "samples": args.samples,
        "build_s": round(build_s, 2),
        "inclusion": incl,
        "consistency": cons,
        "baseline_levelless_inclusion_ms": round(baseline_incl * 1e3, 1),
        "baseline_levelless_consistency_ms": round(baseline_cons * 1e3, 1),
        "speedup_inclusion_p50": round(baseline_incl / statistics.median(gen_incl)),
        "speedup_consistency_p50": round(baseline_cons / statistics.median(gen_cons)),
        "goal_ms": 5,
        "goal_met": max(
            incl["generate"]["p99_ms"] + incl["verify"]["p99_ms"],
            cons["generate"]["p99_ms"] + cons["verify"]["p99_ms"],
        )
        <= 5,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
