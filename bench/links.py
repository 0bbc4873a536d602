"""How long a request's tool results take to link to the receipts that issued their calls.

    python -m bench.links [--db URL] [--receipts N] [--answered 1,10,50] [--rounds R]

An agent's request carries every tool result of its loop so far, and the gateway records
which receipt issued each answered call before it seals the request's receipt
(gateway/completion.py). This appends N realistic receipts to one chain (bench.ledger's
drafts), then resolves K answered call ids of that chain at a time, alternating which goes
first, in the same run: `Ledger.issuers` (what the gateway does, 32 ids per query) against one
`Ledger.find_call` per id (what it did before, the same SQL: a transaction each, four round
trips on Postgres: pool pre-ping, BEGIN, the query, COMMIT). With no --db, a throwaway
Postgres cluster is started and migrated.

The last line of output is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import time
from collections.abc import Callable

from bench.ledger import DraftFactory, append_windowed, database
from bench.measure import percentile


def _timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.links",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", help="database URL (default: a throwaway Postgres)")
    parser.add_argument("--receipts", type=int, default=2000)
    parser.add_argument("--answered", default="1,10,50", help="call ids per request")
    parser.add_argument("--rounds", type=int, default=200, help="requests per figure")
    args = parser.parse_args(argv)
    sizes = [int(k) for k in args.answered.split(",")]

    from receipts.ledger import Ledger
    from receipts.signing import Signer

    tenant = "bench-" + secrets.token_hex(3)
    factory = DraftFactory(tenant, seed=7)
    figures: dict[str, object] = {"receipts": args.receipts, "rounds": args.rounds}
    with database(args.db) as url:
        figures["db"] = url.split(":", 1)[0].split("+")[0]
        with Ledger(url, Signer.generate()) as ledger:
            drafts = [factory.draft() for _ in range(args.receipts)]
            append_windowed(ledger, drafts)
            issued = [c["id"] for d in drafts for c in d.output["tool_calls"]]
            load = os.getloadavg()[0]
            rng = random.Random(11)
            for k in sizes:
                batched, one_each = [], []
                for n in range(args.rounds):
                    ids = rng.sample(issued, k)
                    if n == 0:  # both ways find every issuer
                        found = ledger.issuers(tenant, ids)
                        assert found == {i: ledger.find_call(tenant, i).id for i in ids}
                    ways = [
                        (batched, lambda ids=ids: ledger.issuers(tenant, ids)),
                        (one_each, lambda ids=ids: [ledger.find_call(tenant, i) for i in ids]),
                    ]
                    for times, way in ways if n % 2 else reversed(ways):  # each goes first
                        times.append(_timed(way))
                new, old = percentile(batched, 50), percentile(one_each, 50)
                print(
                    f"{k} answered calls: p50 {new:.3f} ms in one read,"
                    f" {old:.3f} ms with a lookup each ({new / old:.3f} of it)"
                )
                figures[f"k{k}_batched_p50_ms"] = round(new, 3)
                figures[f"k{k}_one_each_p50_ms"] = round(old, 3)
                figures[f"k{k}_batched_over_one_each"] = round(new / old, 4)
    figures["load_average"] = round(load, 2)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
