"""Tokens per second of the embedded engine, unconstrained and under a JSON schema.

The same prompts run free and constrained (greedy, the same token budget); the schema is one
long string field, so the constrained answers run to the budget like the free ones and the
two rates compare per token. Rates are end to end (prompt forward pass included); the time to
the first streamed delta shows the prompt's share.

    python -m bench.embedded [--prompts 6] [--max-tokens 64] [--threads N]

The last line of output is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from runtime.constraint import Constraint
from runtime.engines.base import ChatMessage, Sampling
from runtime.engines.embedded import EmbeddedEngine, default_threads

PROMPTS = [
    "Tell me a story about a lighthouse keeper.",
    "Explain how rain forms.",
    "Describe your favourite city.",
    "Write a letter to a friend about a trip to the mountains.",
    "What makes a good breakfast?",
    "Describe the ocean at night.",
    "Explain how a bicycle works.",
    "Tell me about the history of bread.",
]
SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 2000}},
    "required": ["text"],
    "additionalProperties": False,
}


async def measure(
    engine: EmbeddedEngine, prompts: list[str], constraint: Constraint | None, max_tokens: int
) -> dict[str, float]:
    sampling = Sampling(max_tokens=max_tokens)
    tokens, seconds, first_delta = 0, 0.0, []
    for prompt in prompts:
        start = time.perf_counter()
        first = None
        async for event in engine.stream([ChatMessage("user", prompt)], constraint, sampling):
            if first is None:
                first = time.perf_counter() - start
            final = event
        seconds += time.perf_counter() - start
        tokens += final.completion_tokens  # type: ignore[attr-defined]
        first_delta.append(first or 0.0)
    return {
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2),
        "time_to_first_delta_ms_p50": round(statistics.median(first_delta) * 1000, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, object]:
    engine = EmbeddedEngine.load(threads=args.threads)
    constraint = Constraint.json_schema(SCHEMA)
    prompts = PROMPTS[: args.prompts]
    await engine.generate([ChatMessage("user", "Hi")], constraint, Sampling(max_tokens=4))  # warm
    free = await measure(engine, prompts, None, args.max_tokens)
    constrained = await measure(engine, prompts, constraint, args.max_tokens)
    await engine.aclose()
    return {
        "model": engine.identity.model,
        "backend": engine.identity.backend,
        "threads": args.threads or default_threads(),
        "cpus": os.cpu_count(),
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "unconstrained_tokens_per_s": free["tokens_per_s"],
        "constrained_tokens_per_s": constrained["tokens_per_s"],
        "constrained_over_unconstrained": round(
            constrained["tokens_per_s"] / free["tokens_per_s"], 3
        ),
        "unconstrained_first_delta_ms_p50": free["time_to_first_delta_ms_p50"],
        "constrained_first_delta_ms_p50": constrained["time_to_first_delta_ms_p50"],
        "unconstrained_tokens": free["tokens"],
        "constrained_tokens": constrained["tokens"],
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
