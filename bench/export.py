"""Export of a chain as a bundle: how soon its first bytes leave, and its rate.

    python -m bench.export [--db URL] [--count 20000] [--rounds 3]

Fills a chain with realistic receipts (bench.ledger's DraftFactory, through the real append
path) in a throwaway SQLite ledger (the embedded default) or the database `--db` names, then
exports the whole chain `--rounds` times through Ledger.export into a sink that counts bytes.
The writer reads the receipts twice (once to hash receipts.jsonl for the manifest, once to
write it), so the gateway's first chunk (64 KiB, gateway.pipe) is ready after the first read.
The baseline, measured in the same run, is that first read alone against the whole export:
`first_chunk_over_total` is the share of the export a client waits in silence (1.0 when a
bundle was written whole before its first byte, as exports were until 2026-11-23).

The last line of output is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.ledger import DraftFactory, append_windowed
from bench.measure import percentile

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


def fill(ledger: Any, count: int) -> None:
    """`count` receipts of one factory's agents (tool sets, answers, linked follow-ups)."""
    factory = DraftFactory(TENANT, seed=3)
    append_windowed(ledger, (factory.draft() for _ in range(count)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", help="database URL (default: a throwaway SQLite ledger)")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.count < 1 or args.rounds < 1:
        parser.error("--count and --rounds must be positive")

    from migrations.runner import upgrade
    from receipts.ledger import Ledger
    from receipts.signing import Signer

    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'ledger.db'}"
        upgrade(url)
        load = os.getloadavg()[0]
        with Ledger(url, Signer.generate()) as ledger:
            fill(ledger, args.count)
            totals, firsts, size = [], [], 0
            for _ in range(args.rounds):
                sink = _Sink()
                ledger.export(TENANT, sink)
                totals.append(time.perf_counter() - sink.started)
                firsts.append(sink.first_chunk_s or totals[-1])
                size = sink.size
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
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
