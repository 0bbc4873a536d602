"""Cold grammar compile time per backend over distinct realistic tool sets, and the warm
grammar-cache lookup.

Cold: every tool set is a new union schema (bench/toolsets.py), compiled through the same
path a request takes (limits, syntax check, backend compile, first matcher). A backend that
refuses the sets (it would ignore keywords they use, e.g. minimum/maximum) is also timed on
"relaxed" copies without those keywords, so its compile cost is still on record. Each
backend gets a time budget (--budget seconds) and its sample count is reported. Warm: GrammarCache.get of a cached key (what every request
after the first pays).

    python -m bench.compile [--sets 60] [--budget 240] [--lookups 20000]

The last line of output is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from bench.toolsets import union_for
from runtime.backends import BackendChain, available_backends
from runtime.cache import GrammarCache
from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def strip_keywords(schema: Any, keywords: frozenset[str]) -> Any:
    """The schema without ``keywords`` (the tool sets name no property after a keyword)."""
    if isinstance(schema, list):
        return [strip_keywords(item, keywords) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: strip_keywords(v, keywords) for k, v in schema.items() if k not in keywords}


def cold_compiles(chain: BackendChain, constraints: list[Constraint],
                  budget_s: float) -> dict[str, Any]:
    times, cpu_times, refused, reasons = [], [], 0, set()
    deadline = time.perf_counter() + budget_s
    for constraint in constraints:
        if time.perf_counter() > deadline:
            break
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            chain.compile(constraint).matcher()
        except BackendCannotCompile as exc:
            refused += 1
            reasons.add(exc.message.split(": ", 2)[-1][:120])
            continue
        times.append((time.perf_counter() - t0) * 1000)
        cpu_times.append((time.process_time() - c0) * 1000)
    figures: dict[str, Any] = {"compiled": len(times), "refused": refused}
    if times:
        figures |= {"cold_p50_ms": round(percentile(times, 50), 3),
                    "cold_p99_ms": round(percentile(times, 99), 3),
                    "cold_max_ms": round(max(times), 3),
                    # CPU time of the process: what the compile costs when the host is shared
                    "cold_cpu_p50_ms": round(percentile(cpu_times, 50), 3),
                    "cold_cpu_p99_ms": round(percentile(cpu_times, 99), 3)}
    if reasons:
        figures["refusal_reasons"] = sorted(reasons)[:3]
    return figures


def warm_lookups(tokenizer: Any, constraints: list[Constraint], n: int) -> dict[str, float]:
    cache = GrammarCache(BackendChain(tokenizer))
    try:
        for c in constraints:
            cache.get(c)
        times = []
        for i in range(n):
            c = constraints[i % len(constraints)]
            t0 = time.perf_counter()
            cache.get(c)
            times.append((time.perf_counter() - t0) * 1000)
        stats = cache.stats()["tools"]
    finally:
        cache.close()
    return {"warm_p50_ms": round(percentile(times, 50), 5),
            "warm_p99_ms": round(percentile(times, 99), 5),
            "warm_hits": stats["hits"], "warm_compiles": stats["compiles"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=60)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds per backend")
    parser.add_argument("--lookups", type=int, default=20000)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from runtime.model_store import bundled_model_dir

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    constraints = [Constraint.json_schema(union_for(seed), kind="tools")
                   for seed in range(args.sets)]
    sizes = [len(c.source) for c in constraints]
    print(f"{len(constraints)} distinct tool unions, {min(sizes)}-{max(sizes)} bytes "
          f"(median {statistics.median(sizes):.0f})")
    figures: dict[str, Any] = {"tool_sets": len(constraints),
                               "load_avg_1m": round(os.getloadavg()[0], 2)}
    for name in available_backends():
        start = time.perf_counter()
        chain = BackendChain(tokenizer, [name])
        backend = chain.backend(name)  # tokenizer conversion: once per process
        result: dict[str, Any] = {"init_ms": round((time.perf_counter() - start) * 1000, 1)}
        result |= cold_compiles(chain, constraints, args.budget)
        if result["refused"] and backend.unenforced:
            relaxed = [Constraint.json_schema(strip_keywords(c.schema(), backend.unenforced),
                                              kind="tools") for c in constraints]
            result["relaxed"] = cold_compiles(chain, relaxed, args.budget)
        print(name, result, flush=True)
        figures[name] = result
    figures["cache"] = warm_lookups(tokenizer, constraints, args.lookups)
    print("cache", figures["cache"])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
