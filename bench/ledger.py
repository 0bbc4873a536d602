"""Append throughput and latency of the receipt ledger, through the real append path.

    python -m bench.ledger [--db URL] [--count N] [--writers K] [--tenant T]

K writer processes each open their own Ledger (as K gateway replicas would) on one database
and append N realistic receipts in all to one chain: tool calls of agents using a few tool
sets, with union schemas built by runtime.union_schema exactly as the gateway builds them, answers,
and follow-up requests that link to earlier calls. Each process keeps WINDOW appends in
flight (a loaded gateway), so group commit batches them. Drafts are built before the clock
starts: the figure is the ledger's, not the draft builder's. Then one process appends one at
a time (concurrency 1) for the latency percentiles, and the whole chain is verified from the
database. With no --db, a throwaway Postgres cluster is started and migrated.

The last line of output is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import secrets
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.measure import percentile

WINDOW = 256  # appends in flight per writer process

TOOLSETS: dict[str, list[dict[str, Any]]] = {
    "travel": [
        {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "additionalProperties": False,
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
            },
        },
        {
            "name": "book_flight",
            "parameters": {
                "type": "object",
                "required": ["origin", "destination", "date"],
                "properties": {
                    "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "date": {"type": "string", "format": "date"},
                    "passengers": {"type": "integer", "minimum": 1},
                },
            },
        },
    ],
    "support": [
        {
            "name": "search_docs",
            "parameters": {
                "type": "object",
                "required": ["query"],
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                },
            },
        },
        {
            "name": "create_ticket",
            "parameters": {
                "type": "object",
                "required": ["title", "priority"],
                "properties": {
                    "title": {"type": "string"},
                    "priority": {"type": "string", "enum": ["low", "normal", "high"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        {
            "name": "lookup_order",
            "parameters": {
                "type": "object",
                "required": ["order_id"],
                "properties": {"order_id": {"type": "string", "pattern": "^ord_[0-9]{6}$"}},
            },
        },
    ],
    "data": [
        {
            "name": "run_sql",
            "parameters": {
                "type": "object",
                "required": ["statement"],
                "properties": {
                    "statement": {"type": "string"},
                    "timeout_s": {"type": "number", "minimum": 0},
                },
            },
        },
    ],
}

ARGUMENTS = {
    "get_weather": lambda r: {
        "city": r.choice(["Paris", "Lagos", "Osaka", "Lima"]),
        "unit": r.choice(["celsius", "fahrenheit"]),
        "days": r.randint(1, 14),
    },
    "book_flight": lambda r: {
        "origin": r.choice(["CDG", "LOS", "KIX"]),
        "destination": r.choice(["LIM", "JFK", "NRT"]),
        "date": f"2026-12-{r.randint(10, 28)}",
        "passengers": r.randint(1, 4),
    },
    "search_docs": lambda r: {
        "query": r.choice(["refund policy", "reset password", "api limits"]),
        "limit": r.randint(1, 20),
    },
    "create_ticket": lambda r: {
        "title": "Customer cannot log in",
        "priority": "high",
        "tags": ["auth", "web"][: r.randint(0, 2)],
    },
    "lookup_order": lambda r: {"order_id": f"ord_{r.randint(0, 999999):06d}"},
    "run_sql": lambda r: {
        "statement": "SELECT count(*) FROM orders WHERE status = 'open'",
        "timeout_s": r.choice([1.5, 5, 30]),
    },
}


class DraftFactory:
    """Realistic drafts: an agent calls a tool, and its next request carries the result
    (linking to the call) and gets an answer or another call."""

    def __init__(self, tenant: str, seed: int) -> None:
        from receipts.manifest import build_manifest, schema_hash
        from runtime.tools import parse_tools_field
        from runtime.union_schema import union_schema

        self.tenant = tenant
        self.rng = random.Random(seed)
        self.pending_calls: deque[str] = deque(maxlen=64)
        self.sets = []
        for name, tools in TOOLSETS.items():
            specs = parse_tools_field([{"type": "function", "function": t} for t in tools])
            for parallel in (False, True):
                schema = union_schema(specs, "auto", parallel_tool_calls=parallel)
                manifest = build_manifest(
                    schema_hash=schema_hash(schema),
                    model="SmolLM2-135M-Instruct",
                    weights_digest=_sha(f"weights-{name}"),
                    tokenizer_digest=_sha("tokenizer"),
                    engine="embedded",
                    backend="llguidance",
                    renderer="generic",
                    sampling={"temperature": 0.0, "top_p": 1.0, "seed": 7, "max_tokens": 256},
                    constraint_kind="tools",
                )
                self.sets.append((manifest, schema, [t["name"] for t in tools]))

    def draft(self) -> Any:
        from receipts.record import ReceiptDraft

        r = self.rng
        manifest, schema, names = r.choice(self.sets)
        links = []
        if self.pending_calls and r.random() < 0.5:
            links = [{"tool_call_id": self.pending_calls.popleft(), "receipt_id": None}]
        if r.random() < 0.7:
            calls = [
                {
                    "id": "call_" + secrets.token_hex(12),
                    "name": name,
                    "arguments": ARGUMENTS[name](r),
                }
                for name in [r.choice(names)]
            ]
            self.pending_calls.extend(c["id"] for c in calls)
            output = {"kind": "tool_calls", "tool_calls": calls, "content_sha256": None}
            finish = "tool_calls"
        else:
            output = {
                "kind": "answer",
                "tool_calls": [],
                "content_sha256": _sha(secrets.token_hex(16)),
            }
            finish = "stop"
        return ReceiptDraft(
            tenant=self.tenant,
            manifest=manifest,
            schema=schema,
            request={
                "messages_sha256": _sha(secrets.token_hex(16)),
                "params_sha256": _sha("params"),
            },
            output=output,
            finish_reason=finish,
            usage={"prompt_tokens": r.randint(150, 900), "completion_tokens": r.randint(8, 90)},
            validation={"valid": True, "errors": []},
            fallback=None,
            links=links,
        )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _writer(
    url: str,
    key_pem: bytes,
    tenant: str,
    count: int,
    seed: int,
    ready: Any,
    start: Any,
    results: Any,
) -> None:
    """One writer process: build its drafts, wait for the start, append with WINDOW in flight;
    report its CPU seconds spent appending (all threads: sealing, SQL, the driver)."""
    from receipts.ledger import Ledger
    from receipts.signing import Signer

    factory = DraftFactory(tenant, seed)
    drafts = [factory.draft() for _ in range(count)]
    ledger = Ledger(url, Signer.from_pem(key_pem))  # replicas share the operator's key
    ledger.ping()
    ready.release()
    start.wait()
    cpu = time.process_time()
    append_windowed(ledger, drafts)
    results.put(time.process_time() - cpu)
    ledger.close()


def append_windowed(ledger: Any, drafts: Iterable[Any]) -> None:
    """Append the drafts with WINDOW in flight, as a loaded gateway does: group commit batches
    them."""
    in_flight: deque[Any] = deque()
    for draft in drafts:
        if len(in_flight) >= WINDOW:
            in_flight.popleft().result()
        in_flight.append(ledger.submit(draft))
    for future in in_flight:
        future.result()


def throughput(url: str, tenant: str, count: int, writers: int) -> tuple[float, float, float]:
    """Receipts per second with K processes appending to one chain (start to last commit),
    and the CPU seconds the writers and the Postgres server spent on it."""
    from receipts.signing import Signer

    key_pem = Signer.generate().private_key_pem()
    ctx = mp.get_context("spawn")
    ready, start, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    shares = [count // writers + (i < count % writers) for i in range(writers)]
    procs = [
        ctx.Process(target=_writer, args=(url, key_pem, tenant, n, i, ready, start, results))
        for i, n in enumerate(shares)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    server = server_cpu_seconds(url)
    began = time.perf_counter()
    start.set()
    client = sum(results.get() for _ in procs)
    elapsed = time.perf_counter() - began
    server = server_cpu_seconds(url) - server
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"writer process failed with exit code {p.exitcode}")
    return count / elapsed, client, server


def server_cpu_seconds(url: str) -> float:
    """CPU seconds used so far by the local Postgres cluster serving ``url``: its postmaster
    (with reaped children) and live backends, read from /proc. NaN when it is not local."""
    from sqlalchemy.engine import make_url

    port = make_url(url).port
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        stats[int(proc.name)] = (int(stat[1]), [int(v) for v in stat[11:15]], cmdline)
    postmaster = next(
        (
            pid
            for pid, (_, _, cmd) in stats.items()
            if f"port={port}".encode() in cmd and b"postgres" in cmd
        ),
        None,
    )
    if postmaster is None:
        return float("nan")
    total = sum(stats[postmaster][1])  # utime, stime, cutime, cstime
    total += sum(sum(times[:2]) for ppid, times, _ in stats.values() if ppid == postmaster)
    return total / tick


def latency(url: str, tenant: str, samples: int) -> list[float]:
    """Milliseconds per append at concurrency 1 (each one its own transaction and fsync)."""
    from receipts.ledger import Ledger
    from receipts.signing import Signer

    factory = DraftFactory(tenant, seed=10_000)
    drafts = [factory.draft() for _ in range(samples)]
    times = []
    with Ledger(url, Signer.generate()) as ledger:
        ledger.append(factory.draft())  # warm: connection, key registration
        for draft in drafts:
            began = time.perf_counter()
            ledger.append(draft)
            times.append((time.perf_counter() - began) * 1000)
    return times


def proof_times(
    ledger: Any, tenant: str, size: int, samples: int = 200
) -> tuple[list[float], list[float]]:
    """Milliseconds per inclusion / consistency proof built from the stored tree (what the
    audit API serves), at random seqs and sizes, against the tree of ``size`` leaves."""
    rng = random.Random(1)
    inclusion, consistency = [], []
    for _ in range(samples):
        began = time.perf_counter()
        ledger.inclusion_proof(tenant, rng.randint(1, size), tree_size=size)
        inclusion.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        ledger.consistency_proof(tenant, rng.randint(1, size), size)
        consistency.append((time.perf_counter() - began) * 1000)
    return inclusion, consistency


@contextmanager
def database(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from callproof.devpg import throwaway_postgres
    from migrations.runner import upgrade

    with throwaway_postgres() as pg_url:
        upgrade(pg_url)
        yield pg_url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ledger",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", help="database URL (default: a throwaway Postgres)")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--tenant", default="bench-" + secrets.token_hex(3))
    parser.add_argument("--latency-samples", type=int, default=500)
    args = parser.parse_args(argv)
    if args.count < 1 or args.writers < 1:
        parser.error("--count and --writers must be positive")

    from receipts.ledger import Ledger

    with database(args.db) as url:
        load = os.getloadavg()[0]
        rate, client_s, server_s = throughput(url, args.tenant, args.count, args.writers)
        client_us, server_us = client_s / args.count * 1e6, server_s / args.count * 1e6
        print(
            f"append throughput: {rate:,.0f} receipts/s ({args.count} receipts,"
            f" {args.writers} writer processes, one chain; load average {load:.1f} on"
            f" {os.cpu_count()} CPUs)"
        )
        print(
            f"CPU per receipt: {client_us:.0f} us in the writers (seal, SQL, driver),"
            f" {server_us:.0f} us in Postgres -> {1e6 / (client_us + server_us):,.0f}"
            " receipts per CPU-second"
        )
        times = latency(url, args.tenant, args.latency_samples)
        p50, p99 = percentile(times, 50), percentile(times, 99)
        print(f"single append latency (concurrency 1): p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        with Ledger(url, None) as ledger:
            began = time.perf_counter()
            report = ledger.verify(args.tenant)
            verify_s = time.perf_counter() - began
            inclusion, consistency = proof_times(ledger, args.tenant, report.checked)
        print(
            f"proofs from the store at tree size {report.checked}: inclusion p50"
            f" {percentile(inclusion, 50):.2f} ms p99 {percentile(inclusion, 99):.2f} ms,"
            f" consistency p50 {percentile(consistency, 50):.2f} ms"
            f" p99 {percentile(consistency, 99):.2f} ms"
        )
        print(
            f"database verify: ok={report.ok} over {report.checked} receipts in {verify_s:.1f} s"
            f" ({report.checked / verify_s:,.0f} receipts/s)"
        )
        figures = {
            "db": url.split(":", 1)[0].split("+")[0],
            "receipts": args.count,
            "writers": args.writers,
            "receipts_per_s": round(rate, 1),
            "writer_cpu_us_per_receipt": round(client_us, 1),
            "postgres_cpu_us_per_receipt": round(server_us, 1),
            "receipts_per_cpu_s": round(1e6 / (client_us + server_us), 1),
            "load_average": round(load, 2),
            "append_p50_ms": round(p50, 3),
            "append_p99_ms": round(p99, 3),
            "latency_samples": len(times),
            "verify_ok": report.ok,
            "verified": report.checked,
            "verify_receipts_per_s": round(report.checked / verify_s, 1),
            "inclusion_proof_p50_ms": round(percentile(inclusion, 50), 3),
            "inclusion_proof_p99_ms": round(percentile(inclusion, 99), 3),
            "consistency_proof_p50_ms": round(percentile(consistency, 50), 3),
            "consistency_proof_p99_ms": round(percentile(consistency, 99), 3),
        }
    print(json.dumps(figures))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
