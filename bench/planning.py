"""Per-request CPU cost of the pure tool-calling path the gateway runs around generation.

plan_chat (validate the request, build the union schema, render the prompt), Plan.parse
(re-validate the output) and the stream decoder are on every request's critical path, so
they count against the gateway's overhead budget (p50 <= 2 ms). Measured cold (a tool set
never seen: metaschema checks and validators built) and warm (the agent's usual case: the
same tools on every request), on realistic tool sets.

    python -m bench.planning [--sets 60] [--repeat 400]

The last line of output is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.measure import percentile
from runtime.planning import ChatInput, Plan, plan_chat
from runtime.streaming import EnvelopeStreamDecoder

FIELD_TYPES: list[dict[str, Any]] = [
    {"type": "string", "minLength": 1},
    {"type": "integer", "minimum": 0, "maximum": 1000},
    {"type": "number"},
    {"type": "boolean"},
    {"enum": ["low", "medium", "high"]},
    {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    {"type": "string", "format": "date"},
]


def tool_set(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` function tools of 2-6 typed fields, one nested object, as agents declare them."""
    tools = []
    for t in range(n):
        fields = {f"field_{t}_{i}": rng.choice(FIELD_TYPES) for i in range(rng.randint(2, 6))}
        fields["options"] = {
            "type": "object",
            "properties": {"limit": {"type": "integer"}, "verbose": {"type": "boolean"}},
        }
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{rng.randrange(10**9)}_{t}",
                    "description": "Does one thing for the agent.",
                    "parameters": {
                        "type": "object",
                        "properties": fields,
                        "required": list(fields)[:2],
                    },
                },
            }
        )
    return tools


def call_text(tools: list[dict[str, Any]]) -> str:
    """A valid envelope for the first tool: what the constrained model would emit."""
    function = tools[0]["function"]
    samples = {"string": "abc", "integer": 7, "number": 1.5, "boolean": True, "array": ["x"]}
    arguments = {
        name: schema["enum"][0]
        if "enum" in schema
        else {"limit": 3}
        if schema["type"] == "object"
        else "2026-11-21"
        if schema.get("format") == "date"
        else samples[schema["type"]]
        for name, schema in function["parameters"]["properties"].items()
    }
    return json.dumps({"tool": function["name"], "arguments": arguments})


def timed_ms(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def stream(plan: Plan, text: str) -> None:
    decoder = EnvelopeStreamDecoder(plan)
    for i in range(0, len(text), 4):  # about one token of JSON per delta
        decoder.feed(text[i : i + 4])
    decoder.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=int, default=60, help="distinct tool sets (cold runs)")
    parser.add_argument("--repeat", type=int, default=400, help="warm repetitions")
    args = parser.parse_args()
    rng = random.Random(7)
    messages = [{"role": "user", "content": "Please do the thing for order 42."}]
    sets = [tool_set(rng, rng.randint(2, 8)) for _ in range(args.sets)]
    chats = [ChatInput(messages, tools=tools, model="SmolLM2-135M-Instruct") for tools in sets]

    cold = [timed_ms(lambda c=chat: plan_chat(c), 1)[0] for chat in chats]
    warm_chat = chats[0]
    warm = timed_ms(lambda: plan_chat(warm_chat), args.repeat)
    plan = plan_chat(warm_chat)
    text = call_text(sets[0])
    parse = timed_ms(lambda: plan.parse(text), args.repeat)
    streamed = timed_ms(lambda: stream(plan, text), args.repeat)

    figures = {
        "tool_sets": args.sets,
        "plan_cold_ms_p50": round(percentile(cold, 50), 4),
        "plan_cold_ms_p99": round(percentile(cold, 99), 4),
        "plan_warm_ms_p50": round(percentile(warm, 50), 4),
        "plan_warm_ms_p99": round(percentile(warm, 99), 4),
        "warm_over_cold_p50": round(statistics.median(warm) / statistics.median(cold), 4),
        "parse_ms_p50": round(percentile(parse, 50), 4),
        "parse_ms_p99": round(percentile(parse, 99), 4),
        "stream_decode_ms_p50": round(percentile(streamed, 50), 4),
        "stream_decode_ms_p99": round(percentile(streamed, 99), 4),
        "stream_over_parse_p50": round(statistics.median(streamed) / statistics.median(parse), 3),
        "output_chars": len(text),
    }
    for key, value in figures.items():
        print(f"{key:>24}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
