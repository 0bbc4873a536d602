"""The pure translation of a plan into vLLM's /v1/chat/completions body: the rendered messages,
the sampling parameters and the one constraint as vLLM's ``structured_outputs`` (a plain json,
regex or grammar field, or an xgrammar structural tag for thinking models and tool_choice
"auto"). Kept apart from the engine (runtime.engines.vllm) and its HTTP client
(runtime.engines.vllm_http) so it can be read and tested without any transport."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runtime.constraint import Constraint
from runtime.engines.base import ChatMessage, Sampling
from runtime.errors import BackendCannotCompile, EngineUnavailable
from runtime.gbnf import is_gbnf
from runtime.thinking import Enforcement
from runtime.union_schema import union_calls

# Structural-tag JSON regions ignore the engine's disable_any_whitespace; without a cap a weak
# model loops on newlines inside them (measured on SmolLM2). 0 is refused by xgrammar.
TAG_MAX_WHITESPACE = 1

# vLLM refuses a top_p of 0 (its range is (0, 1]), which OpenAI's allows; its nucleus always
# keeps the likeliest token, so the smallest positive top_p means what 0 does
_LIKELIEST_ONLY = 5e-324


def request_body(
    messages: Sequence[ChatMessage],
    constraint: Constraint | None,
    sampling: Sampling,
    enforcement: Enforcement | None = None,
    *,
    model: str,
    backend: str,
    stream: bool,
    max_model_len: int | None = None,
    think_budget: int | None = None,
) -> dict[str, Any]:
    """The body for ``model`` on a server whose structured-outputs backend is ``backend``;
    ``max_model_len``: the context window, when /v1/models has told it."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        # lowered to the context window, as the embedded engine does; vLLM itself lowers
        # it further to the room the prompt leaves (the receipt keeps the value asked for)
        "max_tokens": min(sampling.max_tokens, max_model_len or sampling.max_tokens),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p or _LIKELIEST_ONLY,
        "stream": stream,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if stream:
        body["stream_options"] = {"include_usage": True}
    if constraint is not None:
        fields = structured_outputs(constraint, enforcement, think_budget=think_budget)
        if "structural_tag" in fields and backend != "xgrammar":
            # vLLM's guidance backend reads only the legacy tag format (no sequences, no
            # per-tag content types): refuse here rather than send what it cannot compile.
            raise EngineUnavailable(
                "reasoning and triggered tool calls need the vLLM server's xgrammar "
                f"structured-output backend; this engine is configured for {backend!r}"
            )
        body["structured_outputs"] = fields
    return body


def structured_outputs(
    constraint: Constraint,
    enforcement: Enforcement | None = None,
    *,
    think_budget: int | None = None,
) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` for one constraint (vLLM >= 0.12 field names).

    Without enforcement (or "always" with no reasoning) this is the plain json/regex/grammar
    field. "triggered" (tool_choice auto): a structural tag that is free text until the
    tool-call start tag and holds each tagged region to the tool-call branches of the union.
    "always" after reasoning: free text up to the end-of-thinking tag, then the constraint.
    """
    if enforcement is None or (enforcement.mode == "always" and not enforcement.reasoning):
        if constraint.is_json:
            return {"json": constraint.schema()}
        return (
            {"regex": constraint.source}
            if constraint.kind == "regex"
            else {"grammar": constraint.source}
        )
    if enforcement.mode == "triggered":
        if constraint.kind != "tools":
            raise ValueError("triggered enforcement needs the tool union constraint")
        union = constraint.schema()
        fmt: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": [enforcement.trigger_start],
            "tags": tool_call_tags(union, enforcement),
            "at_least_one": False,
            # one call unless the union admits several (parallel_tool_calls)
            "stop_after_first": not _allows_parallel(union),
        }
    else:
        thinking: dict[str, Any] = {"type": "any_text"}
        if think_budget is not None:
            thinking["max_tokens"] = think_budget
        fmt = {
            "type": "sequence",
            "elements": [
                # the output opens with the thinking tag, as runtime.planning.Plan.parse expects
                {
                    "type": "tag",
                    "begin": enforcement.think_start,
                    "content": thinking,
                    "end": enforcement.think_end,
                },
                _tag_content(constraint),
            ],
        }
    return {"structural_tag": json.dumps({"type": "structural_tag", "format": fmt})}


def _tag_content(constraint: Constraint) -> dict[str, Any]:
    if constraint.is_json:
        return {
            "type": "json_schema",
            "json_schema": constraint.schema(),
            "max_whitespace_cnt": TAG_MAX_WHITESPACE,
        }
    if constraint.kind == "regex":
        return {"type": "regex", "pattern": constraint.source}
    if not is_gbnf(constraint.source):  # vLLM converts Lark in its plain grammar field only
        raise BackendCannotCompile(
            "after a reasoning region the vLLM server reads a grammar as GBNF only (its"
            " structural tags do not convert Lark): write the grammar in GBNF"
            " (`root ::= ...`)",
            param="grammar",
        )
    return {"type": "grammar", "grammar": constraint.source}


def tool_call_tags(union: dict[str, Any], enforcement: Enforcement) -> list[dict[str, Any]]:
    """One structural tag per tool the union allows, in the tagged families' call format
    (planning's _TAGGED_FAMILIES: ``<tool_call>\n{"name": N, "arguments": ARGS}\n</tool_call>``):
    the tag's begin fixes the tool name, its content is that tool's arguments schema (with the
    union's ``$defs``, so embedded ``$ref``s keep resolving). The name goes first even for
    Hermes, trained on arguments first: each tag needs a begin of its own. Several calls are
    several tags, so the array form of parallel calls is not needed inside a tag; the answer is
    the free text around them.
    """
    defs = union.get("$defs", {})
    tags = []
    for name, arguments in union_calls(union):
        if defs:
            arguments = {**arguments, "$defs": defs}
        content = _tag_content(Constraint.json_schema(arguments))
        begin = f'{enforcement.trigger_start}\n{{"name": {json.dumps(name)}, "arguments": '
        end = "}\n" + enforcement.trigger_end
        tags.append({"type": "tag", "begin": begin, "content": content, "end": end})
    if not tags:
        raise ValueError("the tool union allows no tool call (tool_choice none?)")
    return tags


def _allows_parallel(union: dict[str, Any]) -> bool:
    return any("tool_calls" in b.get("properties", {}) for b in union.get("anyOf", [union]))


__all__ = ["TAG_MAX_WHITESPACE", "request_body", "structured_outputs", "tool_call_tags"]
