"""Export of a chain as a bundle: how soon its first bytes leave, and its rate.

    python -m bench.export [--db URL] [--count 20000] [--rounds 3] [--distinct-schemas BYTES]

Fills a chain with realistic receipts (bench.ledger's DraftFactory, through the real append
path) in a throwaway SQLite ledger (the embedded default) or the database `--db` names, then
exports the whole chain `--rounds` times through Ledger.export into a sink that counts bytes.
The writer reads the receipts twice (once to hash receipts.jsonl for the manifest, once to
write it), so the gateway's first chunk (64 KiB, gateway.pipe) is ready after the first read.
The baseline, measured in the same run, is that first read alone against the whole export:
`first_chunk_over_total` is the share of the export a client waits in silence (1.0 when a
bundle was written whole before its first byte, as exports were until 2026-11-23).

With --distinct-schemas BYTES every receipt binds a tool union of its own, padded by about
BYTES (an agent whose tool descriptions change from call to call). One more export then runs
under tracemalloc: `peak_over_schemas` is its peak of traced memory over the bytes of the
schemas it writes (the writer before 2026-11-24 held every schema parsed: above 1.0).

The last line of output is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.ledger import DraftFactory, append_windowed
from bench.measure import percentile
from receipts.canonical import canonical_json
from receipts.manifest import schema_hash

FIRST_CHUNK = 1 << 16  # what gateway.pipe.ThreadPipe sends first
TENANT = "bench-export"


class _Sink:
    """A binary file that keeps nothing: counts bytes and notes when the first chunk filled."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.size = 0
        self.first_chunk_s: float | None = None

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.first_chunk_s is None and self.size >= FIRST_CHUNK:
            self.first_chunk_s = time.perf_counter() - self.started
        return len(data)

    def flush(self) -> None:
        pass


def fill(ledger: Any, count: int, distinct_schemas: int | None = None) -> int:
    """`count` receipts of one factory's agents (tool sets, answers, linked follow-ups), each
    with a tool union of its own padded by `distinct_schemas` bytes when that is given; the
    bytes of those schemas as a bundle spells them (0 without)."""
    factory = DraftFactory(TENANT, seed=3)
    drafts = (factory.draft() for _ in range(count))
    if distinct_schemas is None:
        append_windowed(ledger, drafts)
        return 0
    own = [_own_schema(d, n, distinct_schemas) for n, d in enumerate(drafts)]
    append_windowed(ledger, own)
    return sum(len(canonical_json(d.schema)) for d in own)


def _own_schema(draft: Any, n: int, padding: int) -> Any:
    schema = {**draft.schema, "description": f"tool set {n} " + "x" * padding}
    manifest = {**draft.manifest, "schema_hash": schema_hash(schema)}
    return dataclasses.replace(draft, schema=schema, manifest=manifest)


def traced_peak(ledger: Any) -> int:
    """The peak of memory Python allocated during one more export (tracemalloc)."""
    tracemalloc.start()
    try:
        ledger.export(TENANT, _Sink())
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", help="database URL (default: a throwaway SQLite ledger)")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--distinct-schemas", type=int, metavar="BYTES")
    args = parser.parse_args(argv)
    if args.count < 1 or args.rounds < 1 or (args.distinct_schemas or 0) < 0:
        parser.error("--count and --rounds must be positive, --distinct-schemas not negative")

    from migrations.runner import upgrade
    from receipts.ledger import Ledger
    from receipts.signing import Signer

    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'ledger.db'}"
        upgrade(url)
        load = os.getloadavg()[0]
        with Ledger(url, Signer.generate()) as ledger:
            schemas = fill(ledger, args.count, args.distinct_schemas)
            totals, firsts, size = [], [], 0
            for _ in range(args.rounds):
                sink = _Sink()
                ledger.export(TENANT, sink)
                totals.append(time.perf_counter() - sink.started)
                firsts.append(sink.first_chunk_s or totals[-1])
                size = sink.size
            peak = traced_peak(ledger) if args.distinct_schemas is not None else 0
    total, first = percentile(totals, 50), percentile(firsts, 50)
    print(
        f"export of {args.count:,} receipts ({size / 2**20:.1f} MiB): {total:.2f} s"
        f" ({args.count / total:,.0f} receipts/s), first {FIRST_CHUNK >> 10} KiB after"
        f" {first:.2f} s ({first / total:.2f} of it); median of {args.rounds} rounds,"
        f" load average {load:.2f}"
    )
    figures = {
        "receipts": args.count,
        "bundle_bytes": size,
        "export_s_p50": round(total, 3),
        "receipts_per_s": round(args.count / total),
        "first_chunk_s_p50": round(first, 3),
        "first_chunk_over_total": round(first / total, 3),
        "rounds": args.rounds,
        "load_average_1m": round(load, 2),
    }
    if args.distinct_schemas is not None:
        print(
            f"schemas {schemas / 2**20:.1f} MiB; the export's traced peak {peak / 2**20:.1f} MiB"
            f" ({peak / schemas:.3f} of them)"
        )
        figures |= {
            "distinct_schema_padding": args.distinct_schemas,
            "schemas_bytes": schemas,
            "export_peak_traced_bytes": peak,
            "peak_over_schemas": round(peak / schemas, 3),
        }
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
