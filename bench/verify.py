"""Offline verification rate of an export bundle (goal: >= 15,000 receipts/s on 100,000).

    python -m bench.verify [--count 100000] [--rebuild]

The bundle is built through the real sealing path (bench.ledger's DraftFactory: tool calls
with union schemas from runtime.union_schema, answers, linked follow-ups; receipts.chain.seal with a
fresh Ed25519 key; the Merkle tree; a signed checkpoint; receipts.bundle_writer.write_bundle) and
cached under /tmp with its public key, since signing 100,000 receipts takes a while. Then
verify_bundle runs pinned to that key: once with the default worker processes (one per CPU)
and once in a single process, the baseline of the same run. Also measured: canonical JSON of
receipt bodies through receipts.canonical versus the rfc8785 reference.

The last line of output is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import rfc8785

from receipts.bundle_verify import verify_bundle
from receipts.bundle_writer import write_bundle
from receipts.canonical import canonical_json
from receipts.checkpoint import make_checkpoint
from receipts.merkle import MerkleTree, leaf_hash
from receipts.record import GENESIS_PREV_HASH
from receipts.seal import seal
from receipts.signing import Signer

TENANT = "bench"


def build(path: Path, key_path: Path, count: int) -> float:
    """Seal `count` receipts and write their bundle; returns the sealing rate (receipts/s)."""
    from bench.ledger import DraftFactory

    factory = DraftFactory(TENANT, seed=1)
    drafts = [factory.draft() for _ in range(count)]
    signer = Signer.generate()
    tree = MerkleTree()
    receipts, schemas = [], {}
    prev = GENESIS_PREV_HASH
    started = time.perf_counter()
    for seq, draft in enumerate(drafts, start=1):
        receipt = seal(draft, seq=seq, prev_hash=prev, signer=signer)
        tree.append(leaf_hash(bytes.fromhex(receipt.entry_hash)))
        receipts.append(receipt)
        schemas[draft.manifest["schema_hash"]] = draft.schema
        prev = receipt.entry_hash
    seal_rate = count / (time.perf_counter() - started)
    checkpoint = make_checkpoint(TENANT, count, tree.root().hex(), signer)
    keys = [
        {
            "key_id": signer.key_id,
            "public_key_pem": signer.public_key_pem(),
            "ranges": [{"chain": TENANT, "first_seq": 1, "last_seq": None}],
        }
    ]
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        write_bundle(tmp, receipts, schemas, keys, checkpoint)
    os.replace(tmp.name, path)
    key_path.write_text(signer.public_key_pem())
    return seal_rate


def _cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (the worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def verify_rate(path: Path, pem: str, count: int, workers: int | None) -> tuple[float, float]:
    """(receipts per wall-clock second, receipts per CPU second of all processes)."""
    started, cpu = time.perf_counter(), _cpu_seconds()
    report = verify_bundle(path, pinned=pem, workers=workers)
    elapsed, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    if not report.ok or report.checked != count:
        raise SystemExit(f"the benchmark bundle does not verify: {report}")
    return count / elapsed, count / cpu


def canonical_speedup(path: Path, samples: int = 2000) -> float:
    """rfc8785 time / receipts.canonical time over receipt bodies taken from the bundle."""
    import tarfile

    with tarfile.open(path, "r:gz") as tar:
        source = tar.extractfile("receipts.jsonl")
        assert source is not None
        bodies = []
        for line in source:
            obj = json.loads(line)
            del obj["entry_hash"], obj["signature"]
            bodies.append(obj)
            if len(bodies) == samples:
                break
    assert all(canonical_json(b) == rfc8785.dumps(b) for b in bodies)
    t0 = time.perf_counter()
    for body in bodies:
        rfc8785.dumps(body)
    t1 = time.perf_counter()
    for body in bodies:
        canonical_json(body)
    t2 = time.perf_counter()
    return (t1 - t0) / (t2 - t1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verify", description=__doc__)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rebuild", action="store_true", help="ignore the cached bundle")
    args = parser.parse_args(argv)
    path = Path(tempfile.gettempdir()) / f"callproof-bench-verify-{args.count}.tar.gz"
    key_path = path.parent / f"callproof-bench-verify-{args.count}.pub.pem"
    seal_rate = None
    if args.rebuild or not (path.exists() and key_path.exists()):
        print(f"sealing {args.count} receipts into {path} ...", flush=True)
        seal_rate = build(path, key_path, args.count)
        print(f"sealed at {seal_rate:,.0f} receipts/s", flush=True)
    else:
        print(f"using the cached bundle {path}", flush=True)
    pem = key_path.read_text()
    load = os.getloadavg()[0]
    parallel, parallel_cpu = verify_rate(path, pem, args.count, workers=None)
    print(
        f"verify, {os.cpu_count()} worker processes: {parallel:,.0f} receipts/s"
        f" ({parallel_cpu:,.0f} per CPU second)",
        flush=True,
    )
    single, single_cpu = verify_rate(path, pem, args.count, workers=1)
    print(
        f"verify, one process: {single:,.0f} receipts/s ({single_cpu:,.0f} per CPU second)",
        flush=True,
    )
    speedup = canonical_speedup(path)
    print(f"canonical JSON of a receipt body: {speedup:.1f}x faster than rfc8785", flush=True)
    cpus = os.cpu_count() or 1
    figures = {
        "receipts": args.count,
        "bundle_mb": round(path.stat().st_size / 1e6, 1),
        "cpus": cpus,
        "load_average_at_start": round(load, 2),
        "verify_receipts_per_s": round(parallel),
        "verify_single_process_receipts_per_s": round(single),
        "parallel_over_single": round(parallel / single, 2),
        "verify_receipts_per_cpu_s": round(parallel_cpu),
        "cpu_bound_receipts_per_s_on_idle_cores": round(parallel_cpu * cpus),
        "canonical_over_rfc8785": round(speedup, 1),
        "seal_receipts_per_s": None if seal_rate is None else round(seal_rate),
        "goal_receipts_per_s": 15000,
        "goal_met": parallel >= 15000,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
