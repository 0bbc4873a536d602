"""`callproof generate`: one constrained generation on the embedded engine, from the shell.

It goes through ``plan_chat`` exactly as the gateway does, so a tool set tried here gets the
same union schema, the same rendered prompt and the same parse as an agent's request would.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PROG = "callproof generate"

EXTRA = "embedded"
COMMANDS = ("generate",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate under a constraint with the embedded engine",
        description="Generate one answer with the embedded engine, held to one constraint.",
    )
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument("--schema", type=Path, metavar="FILE", help="JSON schema file")
    constraint.add_argument("--regex", metavar="R", help="regex the whole output must match")
    constraint.add_argument("--grammar", type=Path, metavar="FILE", help="EBNF grammar file")
    constraint.add_argument(
        "--tools", type=Path, metavar="FILE", help="OpenAI tools array (JSON file)"
    )
    parser.add_argument(
        "--tool-choice",
        default=None,
        metavar="auto|required|none|NAME",
        help="with --tools: auto (default), required, none, or a tool's name",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--max-tokens", type=_positive_int, default=256, metavar="N")
    parser.add_argument("--seed", type=int, default=None, metavar="S")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T")
    parser.add_argument("--model", default=None, help="local HF directory or .gguf file")
    parser.add_argument("prompt", metavar="PROMPT")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from runtime.errors import EngineError, RuntimeInputError, StructuredOutputInvalid

    try:
        chat = _chat_input(args)
        return _run(args, chat)
    except EngineError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except StructuredOutputInvalid as exc:
        print(
            f"{PROG}: {exc.message} (at {exc.pointer or '/'}); raw output: {exc.raw_output!r}",
            file=sys.stderr,
        )
        return 1
    except RuntimeInputError as exc:
        where = f" ({exc.param})" if exc.param else ""
        print(f"{PROG}: {exc.message}{where}", file=sys.stderr)
        return 2


def _chat_input(args: argparse.Namespace) -> Any:
    """The request as the gateway would receive it; bad files raise a RuntimeInputError."""
    from runtime.errors import RuntimeInputError
    from runtime.planning import ChatInput

    if args.tool_choice is not None and args.tools is None:
        raise RuntimeInputError("--tool-choice needs --tools", param="tool_choice")
    fields: dict[str, Any] = {"messages": [{"role": "user", "content": args.prompt}]}
    if args.schema is not None:
        schema = _read_json(args.schema, "--schema")
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    elif args.regex is not None:
        fields["regex"] = args.regex
    elif args.grammar is not None:
        fields["grammar"] = _read_text(args.grammar, "--grammar")
    elif args.tools is not None:
        fields["tools"] = _read_json(args.tools, "--tools")
        fields["tool_choice"] = _tool_choice(args.tool_choice)
    return ChatInput(**fields)


def _run(args: argparse.Namespace, chat: Any) -> int:
    import asyncio
    import dataclasses

    from runtime.constraint import validate_constraint
    from runtime.engines.base import Sampling
    from runtime.engines.embedded import EmbeddedEngine
    from runtime.planning import plan_chat

    plan = plan_chat(chat)  # before loading the model: bad input fails in milliseconds
    if plan.constraint is not None:
        validate_constraint(plan.constraint)
    sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    engine = EmbeddedEngine.load(args.model)
    plan = plan_chat(dataclasses.replace(chat, model=engine.identity.model))

    async def once() -> Any:
        try:
            return await engine.generate(plan.messages, plan.constraint, sampling)
        finally:
            await engine.aclose()

    generation = asyncio.run(once())
    parsed = plan.parse(generation.text)
    if not args.json:
        print(parsed.content if parsed.kind != "tool_calls" else generation.text)
        return 0
    print(
        json.dumps(
            {
                "text": generation.text,
                "answer": parsed.answer,
                "parsed": parsed.parsed,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.arguments}
                    for c in parsed.tool_calls
                ],
                "backend": generation.backend,
                "finish_reason": generation.finish_reason,
                "fallback": generation.fallback,
            },
            ensure_ascii=False,
        )
    )
    return 0


def _tool_choice(value: str | None) -> Any:
    if value is None or value in ("auto", "required", "none"):
        return value
    return {"type": "function", "function": {"name": value}}


def _read_text(path: Path, flag: str) -> str:
    from runtime.errors import RuntimeInputError

    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RuntimeInputError(f"{flag}: cannot read {path}: {exc}", param=flag) from None


def _read_json(path: Path, flag: str) -> Any:
    from runtime.errors import RuntimeInputError

    text = _read_text(path, flag)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RuntimeInputError(f"{flag}: {path} is not valid JSON: {exc}", param=flag) from None


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number
