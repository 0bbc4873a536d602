"""Cold grammar compile time per backend over distinct realistic tool sets, and the warm
grammar-cache lookup.

Cold: every tool set is a new union schema (bench/toolsets.py), compiled through the same
path a request takes (limits, syntax check, backend compile, first matcher). A backend that
refuses the sets (it would ignore keywords they use, e.g. minimum/maximum) is also timed on
"relaxed" copies without those keywords, so its compile cost is still on record. Each
backend runs in a child process killed after --budget seconds (an Outlines compile can take
minutes); the sample counts say how far it got. Warm: GrammarCache.get of a cached key (what
every request after the first pays).

    python -m bench.compile [--sets 60] [--budget 240] [--lookups 20000]

The last line of output is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from queue import Empty
from typing import Any

from bench.measure import percentile
from bench.toolsets import union_for
from runtime.backends import BackendChain, available_backends
from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile
from runtime.grammar_cache import GrammarCache


def strip_keywords(schema: Any, keywords: frozenset[str]) -> Any:
    """The schema without ``keywords`` (the tool sets name no property after a keyword)."""
    if isinstance(schema, list):
        return [strip_keywords(item, keywords) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: strip_keywords(v, keywords) for k, v in schema.items() if k not in keywords}


def _compile_worker(tokenizer: Any, name: str, constraints: list[Constraint], queue: Any) -> None:
    """Child process: report init time, then one item per compile, full schemas first and,
    when the backend refuses them, relaxed copies without the keywords it would ignore."""
    start = time.perf_counter()
    chain = BackendChain(tokenizer, [name])
    backend = chain.backend(name)  # tokenizer conversion: once per process
    queue.put(("init", (time.perf_counter() - start) * 1000))
    passes = [("full", constraints)]
    if backend.unenforced:
        passes.append(
            (
                "relaxed",
                [
                    Constraint.json_schema(
                        strip_keywords(c.schema(), backend.unenforced), kind="tools"
                    )
                    for c in constraints
                ],
            )
        )
    for label, batch in passes:
        refused = 0
        for constraint in batch:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                chain.compile(constraint).matcher()
            except BackendCannotCompile as exc:
                refused += 1
                queue.put((label, "refused", exc.message.split(": ", 2)[-1][:120]))
                continue
            queue.put(
                (
                    label,
                    "ok",
                    ((time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000),
                )
            )
        if not refused:
            break  # nothing refused: no relaxed pass needed


def cold_compiles(
    tokenizer: Any, name: str, constraints: list[Constraint], budget_s: float
) -> dict[str, Any]:
    """Run the compiles in a child process that is killed at the budget: one Outlines compile
    can take minutes, and a compile cannot be interrupted in-process."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(
        target=_compile_worker, args=(tokenizer, name, constraints, queue), daemon=True
    )
    child.start()
    deadline = time.monotonic() + budget_s
    items = []
    while time.monotonic() < deadline and (child.is_alive() or not queue.empty()):
        try:
            items.append(queue.get(timeout=min(1.0, max(0.01, deadline - time.monotonic()))))
        except Empty:
            continue
    timed_out = child.is_alive()
    child.kill()
    child.join()
    figures: dict[str, Any] = {"init_ms": round(items[0][1], 1) if items else None}
    for label in ("full", "relaxed"):
        done = [i for i in items[1:] if i[0] == label]
        if not done:
            continue
        wall = [i[2][0] for i in done if i[1] == "ok"]
        cpu = [i[2][1] for i in done if i[1] == "ok"]
        part: dict[str, Any] = {"compiled": len(wall), "refused": len(done) - len(wall)}
        if wall:
            part |= {
                "cold_p50_ms": round(percentile(wall, 50), 3),
                "cold_p99_ms": round(percentile(wall, 99), 3),
                # CPU time: what the compile costs when the host is shared
                "cold_cpu_p50_ms": round(percentile(cpu, 50), 3),
                "cold_cpu_p99_ms": round(percentile(cpu, 99), 3),
            }
        reasons = sorted({i[2] for i in done if i[1] == "refused"})
        if reasons:
            part["refusal_reasons"] = reasons[:3]
        figures[label] = part
    figures["stopped_at_budget"] = timed_out
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
    return {
        "warm_p50_ms": round(percentile(times, 50), 5),
        "warm_p99_ms": round(percentile(times, 99), 5),
        "warm_hits": stats["hits"],
        "warm_compiles": stats["compiles"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=60)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds per backend")
    parser.add_argument("--lookups", type=int, default=20000)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from runtime.model_store import bundled_model_dir

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    constraints = [
        Constraint.json_schema(union_for(seed), kind="tools") for seed in range(args.sets)
    ]
    sizes = [len(c.source) for c in constraints]
    print(
        f"{len(constraints)} distinct tool unions, {min(sizes)}-{max(sizes)} bytes "
        f"(median {statistics.median(sizes):.0f})"
    )
    figures: dict[str, Any] = {
        "tool_sets": len(constraints),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    for name in available_backends():
        figures[name] = cold_compiles(tokenizer, name, constraints, args.budget)
        print(name, figures[name], flush=True)
    figures["cache"] = warm_lookups(tokenizer, constraints, args.lookups)
    print("cache", figures["cache"])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
