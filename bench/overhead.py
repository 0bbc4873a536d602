"""The gateway's own cost per request: latency through the gateway minus latency of calling the
upstream directly, in the same run, at concurrency 1 and 32, p50 and p99.

    python -m bench.overhead [--requests 400] [--rounds 5] [--warmup 50] [--answered 0]
                             [--upstream-ms 0]

Setup (all on 127.0.0.1, all real): a throwaway Postgres cluster holds the ledger; an
OpenAI-compatible upstream that answers at once (a tiny ASGI app in this file, serving a fixed
tool call, run by uvicorn in its own process) stands in for vLLM; `callproof serve --engine
vllm` runs in its own process in front of it, with an agent key made by `callproof keys`.
Each request through the gateway is authenticated, validated, planned (tool union schema),
forwarded, parsed, validated again, and its signed receipt committed to Postgres before the
response leaves. The client sends the same OpenAI request body to both. With `--answered K`
that body is an agent's K-th turn: it carries K earlier calls (issued through the gateway
before the clock starts) and their tool results, which the gateway links to the receipts
that issued them. With `--upstream-ms N` the upstream answers after N ms, as a model
takes time to generate, for both paths alike: the gateway's work done while it waits (the
tool results' links are read meanwhile) drops out of the overhead.

This 2-core VM's speed drifts by up to 2x within minutes, so each concurrency runs `rounds`
neighbouring pairs of phases (direct, then gateway, `requests` each): the overhead is the
median over rounds of each pair's difference, with the lowest and highest round beside it.

The last line of output is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.gateway_process import running_gateway, wait_ready
from bench.measure import cpu_seconds, percentile
from callproof.devpg import free_port, throwaway_postgres

MODEL = "bench-upstream"
TOOL_CALL = '{"tool":"get_weather","arguments":{"city":"Paris"}}'
REQUEST = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "temperature": 0,
    "max_tokens": 32,
}


# --------------------------------------------------------------------------- the upstream

_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-upstream",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": TOOL_CALL},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 14, "total_tokens": 54},
    }
).encode()
_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()


_DELAY_ENV = "CALLPROOF_BENCH_UPSTREAM_MS"
_DELAY_S = float(os.environ.get(_DELAY_ENV, "0")) / 1000  # read in the upstream's process


async def upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An OpenAI-compatible server that answers every chat completion at once, or after
    the milliseconds its environment's CALLPROOF_BENCH_UPSTREAM_MS says."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if _DELAY_S and scope["path"] != "/v1/models":
        await asyncio.sleep(_DELAY_S)
    body = _MODELS if scope["path"] == "/v1/models" else _COMPLETION
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- measuring


def answering(call_ids: list[str]) -> dict[str, Any]:
    """REQUEST as an agent sends it after its calls ``call_ids`` have run: each call and its
    tool result in the conversation, then the question again."""
    turns: list[dict[str, Any]] = []
    for call_id in call_ids:
        function = {"name": "get_weather", "arguments": '{"city":"Paris"}'}
        call = {"id": call_id, "type": "function", "function": function}
        turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        turns.append({"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C."})
    question = REQUEST["messages"]
    return {**REQUEST, "messages": [*question, *turns, *question]}


def issue_calls(url: str, key: str, count: int) -> list[str]:
    """The ids of ``count`` tool calls issued through the gateway (each with its receipt)."""
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        answers = [client.post(url, json=REQUEST) for _ in range(count)]
    return [a.json()["choices"][0]["message"]["tool_calls"][0]["id"] for a in answers]


async def measure(
    url: str, headers: dict[str, str], body: bytes, requests: int, concurrency: int
) -> list[float]:
    """Latencies (ms) of `requests` POSTs of ``body`` over `concurrency` keep-alive connections.

    A raw HTTP/1.1 client (pre-built request bytes, Content-Length framed responses) keeps the
    load generator's own CPU per request in the tens of microseconds: on 2 cores a full HTTP
    client library would be the bottleneck at concurrency 32 and blur both sides alike."""
    parsed = httpx.URL(url)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    message = (
        f"POST {parsed.raw_path.decode()} HTTP/1.1\r\nHost: {parsed.host}\r\n{head}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    remaining = iter(range(requests))

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
        try:
            for _ in remaining:
                started = time.perf_counter()
                writer.write(message)
                status_line = await reader.readline()
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                payload = await reader.readexactly(length)
                latencies.append((time.perf_counter() - started) * 1000)
                if b" 200 " not in status_line:
                    raise RuntimeError(f"{url} answered {status_line!r}: {payload[:300]!r}")
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def append_seconds(metrics_url: str) -> tuple[float, float]:
    """(sum, count) of the gateway's receipt-commit histogram, read from /metrics."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(metrics_url)).text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("callproof_receipt_append_duration_seconds_")
    }
    return (
        values["callproof_receipt_append_duration_seconds_sum"],
        values["callproof_receipt_append_duration_seconds_count"],
    )


async def compare(
    direct: str,
    gateway: str,
    metrics: str,
    key: str,
    body: bytes,
    *,
    requests: int,
    rounds: int,
    warmup: int,
    pid: int,
) -> dict[str, float]:
    """Overhead = gateway minus direct, per percentile (median, min and max over rounds);
    plus the gateway's CPU per request (all threads, and its event loop's thread alone) and
    the mean time of the durable receipt commit inside it (the part a faster disk, not
    faster code, would shrink)."""
    figures: dict[str, float] = {}
    auth = {"Authorization": f"Bearer {key}"}
    for concurrency in (1, 32):
        await measure(direct, {}, body, warmup, concurrency)
        await measure(gateway, auth, body, warmup, concurrency)
        pairs: list[tuple[list[float], list[float]]] = []
        cpu = loop_cpu = 0.0
        sum0, count0 = await append_seconds(metrics)
        for _ in range(rounds):
            base = await measure(direct, {}, body, requests, concurrency)
            cpu0, loop0 = cpu_seconds(pid), cpu_seconds(pid, thread=pid)
            through = await measure(gateway, auth, body, requests, concurrency)
            cpu += cpu_seconds(pid) - cpu0
            loop_cpu += cpu_seconds(pid, thread=pid) - loop0
            pairs.append((base, through))
        sum1, count1 = await append_seconds(metrics)
        name = f"c{concurrency}"
        per_request = 1000 / (rounds * requests)
        figures[f"{name}_gateway_cpu_ms_per_request"] = round(cpu * per_request, 3)
        # uvicorn runs the event loop on the process's main thread (its id is the pid); the
        # rest is the ledger's writer thread and the helper pools
        figures[f"{name}_loop_cpu_ms_per_request"] = round(loop_cpu * per_request, 3)
        figures[f"{name}_commit_mean_ms"] = round((sum1 - sum0) / (count1 - count0) * 1000, 3)
        for q in (50, 99):
            overheads = [percentile(g, q) - percentile(d, q) for d, g in pairs]
            figures[f"{name}_direct_p{q}_ms"] = round(
                statistics.median(percentile(d, q) for d, _ in pairs), 3
            )
            figures[f"{name}_gateway_p{q}_ms"] = round(
                statistics.median(percentile(g, q) for _, g in pairs), 3
            )
            figures[f"{name}_overhead_p{q}_ms"] = round(statistics.median(overheads), 3)
            figures[f"{name}_overhead_p{q}_ms_rounds_min"] = round(min(overheads), 3)
            figures[f"{name}_overhead_p{q}_ms_rounds_max"] = round(max(overheads), 3)
    return figures


def run(
    requests: int, rounds: int, warmup: int, answered: int = 0, upstream_ms: float = 0
) -> dict[str, Any]:
    up_port = free_port()
    with throwaway_postgres() as db, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        upstream_log = (workdir / "upstream.log").open("wb")
        stand_in = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "bench.overhead:upstream"),
                *("--port", str(up_port), "--log-level", "warning", "--no-access-log"),
            ],
            stdout=upstream_log,
            stderr=subprocess.STDOUT,
            env={**os.environ, _DELAY_ENV: str(upstream_ms)},
        )
        up_url = f"http://127.0.0.1:{up_port}"
        try:
            wait_ready(up_url + "/v1/models", stand_in, 60, workdir / "upstream.log")
            with running_gateway(up_url, MODEL, db, workdir) as gateway:
                chat = gateway.url + "/v1/chat/completions"
                calls = issue_calls(chat, gateway.agent_key, answered)
                if calls:
                    _analyze(db)
                figures = asyncio.run(
                    compare(
                        up_url + "/v1/chat/completions",
                        chat,
                        gateway.url + "/metrics",
                        gateway.agent_key,
                        json.dumps(answering(calls) if calls else REQUEST).encode(),
                        requests=requests,
                        rounds=rounds,
                        warmup=warmup,
                        pid=gateway.pid,
                    )
                )
        finally:
            stand_in.terminate()
            stand_in.wait(30)
            upstream_log.close()
        receipts = _count_receipts(db)
    return {
        "requests_per_phase": requests,
        "rounds": rounds,
        "answered_calls": answered,
        "upstream_ms": upstream_ms,
        "receipts_committed": receipts,
        "load_average_1m": round(os.getloadavg()[0], 2),
        **figures,
    }


def _analyze(url: str) -> None:
    """Gather the planner's statistics, as autovacuum does within its first minute: on
    tables never analyzed, Postgres took the (chain, tool_name, seq) index for a lookup by
    call id and scanned every call of the chain (measured: 5 to 60 ms over 400 requests)."""
    _sql(url, "ANALYZE")


def _count_receipts(url: str) -> int:
    return int(_sql(url, "SELECT count(*) FROM receipts"))


def _sql(url: str, statement: str) -> Any:
    """One statement on its own connection, in autocommit; its first value, if it has rows."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.exec_driver_sql(statement)
            return result.scalar() if result.returns_rows else None
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="per phase")
    parser.add_argument("--rounds", type=int, default=5, help="direct+gateway phase pairs")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--answered", type=int, default=0, help="earlier tool calls each request answers"
    )
    parser.add_argument(
        "--upstream-ms", type=float, default=0, help="how long the upstream takes to answer"
    )
    args = parser.parse_args()
    figures = run(args.requests, args.rounds, args.warmup, args.answered, args.upstream_ms)
    for name, value in figures.items():
        print(f"{name:>28}: {value}")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
