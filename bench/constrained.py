"""What constraining costs per generated token: decode time constrained vs unconstrained on
the same model and prompts, and the mask computation alone, for every installed backend.

Decode: the bundled SmolLM2, greedy, a KV-cached loop (as the embedded engine runs it), the
same prompts with and without ConstrainedLogitsProcessor on a tool union; runs interleaved
(rotating order) so machine load hits all alike. The ratio compares each constrained run with
the unconstrained run of the same prompt and round over the same step positions (median over
pairs), wall clock and process CPU. Per-token time excludes prefill and compile. Mask: the
token sequences the model produced under the constraint are replayed through each backend's
matcher, timing fill_next_token_bitmask per token; the torch application of the mask to the
logits is timed apart. Backends that refuse the union
(they would ignore keywords it uses) run on a copy without those keywords, marked "relaxed".

    python -m bench.constrained [--prompts 3] [--tokens 40] [--rounds 2]

The last line of output is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import Any

import torch

from bench.compile import strip_keywords
from bench.measure import percentile
from bench.toolsets import FAMILIES, union_of
from runtime.backends import BackendChain, available_backends
from runtime.backends.base import CompiledGrammar, allocate_bitmask, bitmask_to_bool
from runtime.constrained import ConstrainedLogitsProcessor
from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile

QUESTIONS = [
    "What's the weather in Lisbon for the next 3 days, in celsius?",
    "Book a 30 minute meeting called Sync tomorrow at 10:00 with ana@example.com.",
    "Show me the 10 latest orders over 100 euros.",
    "Email bob@example.com that the report is late, high priority.",
    "Find business class flights from CDG to JFK on 2025-03-01 for 2 people.",
]


def prompt_ids(tokenizer: Any, tools: list[dict[str, Any]], question: str) -> list[int]:
    system = (
        "You can call these tools. Answer with one JSON object "
        '{"tool": NAME, "arguments": {...}} or {"answer": TEXT}.\n' + json.dumps(tools)
    )
    return tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}],
        add_generation_prompt=True,
        return_dict=True,
    )["input_ids"]


def decode(
    model: Any,
    ids: list[int],
    steps: int,
    eos: int,
    grammar: CompiledGrammar | None,
    tokenizer: Any,
) -> tuple[list[int], list[float], list[float]]:
    """Greedy KV-cached decode; per-token wall and process-CPU seconds after prefill."""
    from transformers import DynamicCache

    processor = (
        ConstrainedLogitsProcessor(grammar.matcher(), tokenizer) if grammar is not None else None
    )
    seq, times, cpu = list(ids), [], []
    past = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([seq]), past_key_values=past, use_cache=True).logits[
            :, -1, :
        ]
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            if processor is not None:
                logits = processor(torch.tensor([seq]), logits)
            token = int(logits.argmax())
            if token == eos:
                break
            seq.append(token)
            logits = model(
                input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True
            ).logits[:, -1, :]
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return seq[len(ids) :], times, cpu


def compile_for(chain: BackendChain, schema: dict[str, Any]) -> tuple[CompiledGrammar, bool]:
    """The backend's grammar for the schema, relaxed when it refuses the full one."""
    backend = chain.backend(chain.names[0])
    try:
        return chain.compile(Constraint.json_schema(schema, kind="tools")), False
    except BackendCannotCompile:
        relaxed = strip_keywords(schema, backend.unenforced)
        return chain.compile(Constraint.json_schema(relaxed, kind="tools")), True


def mask_times(
    grammar: CompiledGrammar, sequences: list[list[int]], vocab: int, repeat: int = 10
) -> list[float]:
    """Microseconds of fill_next_token_bitmask along each (valid) token sequence."""
    bitmask, out = allocate_bitmask(vocab), []
    for seq in sequences * repeat:
        matcher = grammar.matcher()
        for token in seq:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            out.append((time.perf_counter() - t0) * 1e6)
            if not matcher.accept_token(token):
                break
    return out


def apply_times(vocab: int, n: int = 2000) -> list[float]:
    bitmask = allocate_bitmask(vocab)
    bitmask[0, ::3] = 0
    logits = torch.randn(1, vocab)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        logits[0].masked_fill_(~bitmask_to_bool(bitmask[0], vocab), float("-inf"))
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtime.model_store import bundled_model_dir

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir(), dtype=torch.float32).eval()
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    # Two tools (weather, email): small enough that Outlines compiles it in bounded time.
    rng = random.Random(7)
    tools = [
        {"type": "function", "function": {"name": name, "parameters": FAMILIES[name](rng)}}
        for name in ("get_weather", "send_email")
    ]
    schema = union_of(tools)
    prompts = [prompt_ids(tokenizer, tools, q) for q in QUESTIONS[: args.prompts]]
    names = available_backends()
    grammars, relaxed = {}, {}
    for name in names:
        grammars[name], relaxed[name] = compile_for(BackendChain(tokenizer, [name]), schema)

    variants: list[str] = ["none", *names]
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    # per (round, prompt): constrained time / unconstrained time over the same step positions
    # (a constrained run stops when its grammar completes; later steps cost more KV)
    paired: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    outputs: list[list[int]] = []
    for rnd in range(args.rounds):
        for i, ids in enumerate(prompts):
            shift = (rnd * len(prompts) + i) % len(variants)  # rotate who runs first
            runs = {}
            for variant in variants[shift:] + variants[:shift]:
                out, w, c = decode(model, ids, args.tokens, eos, grammars.get(variant), tokenizer)
                runs[variant] = (w, c)
                wall[variant] += w
                cpu[variant] += c
                if rnd == 0 and variant == names[0]:
                    outputs.append(out)
                    print("output:", tokenizer.decode(out)[:120], flush=True)
            base_w, base_c = runs["none"]
            for name in names:
                w, c = runs[name]
                n = min(len(w), len(base_w))
                paired[name].append((sum(w[:n]) / sum(base_w[:n]), sum(c[:n]) / sum(base_c[:n])))

    base_wall, base_cpu = statistics.median(wall["none"]), statistics.median(cpu["none"])
    figures: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct fp32",
        "prompts": len(prompts),
        "rounds": args.rounds,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "unconstrained_ms_per_token": round(base_wall * 1000, 2),
        "unconstrained_cpu_ms_per_token": round(base_cpu * 1000, 2),
        "apply_mask_p50_us": round(percentile(apply_times(vocab), 50), 1),
    }
    for name in names:
        masks = mask_times(grammars[name], outputs, vocab)
        figures[name] = {
            "relaxed_schema": relaxed[name],
            "ms_per_token": round(statistics.median(wall[name]) * 1000, 2),
            "ratio": round(statistics.median(r for r, _ in paired[name]), 3),
            "cpu_ratio": round(statistics.median(r for _, r in paired[name]), 3),
            "mask_p50_us": round(percentile(masks, 50), 1),
            "mask_p99_us": round(percentile(masks, 99), 1),
            "mask_samples": len(masks),
        }
        print(name, figures[name], flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
