"""The union schema: the one JSON *envelope* the decoder is held to when tools are given (the
model never answers free-form then)::

    {"tool": NAME, "arguments": {...}}                  one call
    {"tool_calls": [{"tool": ..., "arguments": ...}]}   several (parallel_tool_calls)
    {"answer": "..."}                                    no call (or the response_format value)

Reading that envelope back is runtime/output_parsing.py's business.

Decisions a reader may look for:

* with response_format the answer is ``{"answer": <value>}``, never the bare value, so a
  response schema that accepts objects cannot be mistaken for a call;
* every tool's parameters and the response schema are closed (runtime/closed_schema.py);
* branches are joined with ``anyOf`` (they are disjoint, so it means ``oneOf``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runtime.closed_schema import closed_schema
from runtime.pointer_refs import pointer_refs
from runtime.schema_check import refs_in
from runtime.tools import (
    RESPONSE_SCHEMA_PARAM,
    ResponseFormat,
    ToolSpec,
    parse_response_format,
    parse_tool_choice,
)


def union_schema(
    tools: Sequence[ToolSpec],
    tool_choice: Any = "auto",
    response_format: ResponseFormat | Mapping[str, Any] | None = None,
    parallel_tool_calls: bool = False,
) -> dict[str, Any]:
    """The one JSON schema the decoder is held to when tools are given.

    Branches are mutually exclusive by their required key ("tool", "tool_calls", "answer")
    and closed (additionalProperties false), so they are joined with ``anyOf``, which means
    the same as ``oneOf`` here and which every backend compiles (llguidance refuses a
    ``oneOf`` it cannot prove disjoint, e.g. across ``$ref``). With
    ``response_format`` the answer branch is ``{"answer": <response schema>}``: wrapping keeps
    a response schema that itself accepts objects from ever matching a tool call. A tool whose
    parameters use ``$ref`` is moved under ``$defs`` with its pointers rewritten, so refs keep
    resolving once embedded; calls shared by the single and parallel forms live in ``$defs``
    too, so the schema (and its compile time) does not double.
    """
    choice = parse_tool_choice(tool_choice, tools)
    rf = response_format
    if isinstance(rf, Mapping):
        rf = parse_response_format(dict(rf))
    defs: dict[str, Any] = {}
    branches: list[dict[str, Any]] = []
    allowed = (  # each with its index in tools, which errors name
        [(i, t) for i, t in enumerate(tools) if choice.allows(t.name)]
        if choice.allows_calls
        else []
    )
    if allowed and parallel_tool_calls:
        for i, tool in allowed:
            defs[f"call-{tool.name}"] = _call_branch(tool, i, defs)
        refs = [{"$ref": f"#/$defs/call-{t.name}"} for _, t in allowed]
        items = refs[0] if len(refs) == 1 else {"anyOf": refs}
        branches.extend(refs)
        branches.append(
            _closed_object({"tool_calls": {"type": "array", "items": items, "minItems": 1}})
        )
    else:
        branches.extend(_call_branch(t, i, defs) for i, t in allowed)
    if choice.allows_answer:
        answer: dict[str, Any] = {"type": "string"}
        if rf is not None and rf.schema is not None:
            answer = _embed(closed_schema(rf.schema, param=RESPONSE_SCHEMA_PARAM), "answer", defs)
        branches.append(_closed_object({"answer": answer}))
    schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
    if defs:
        schema["$defs"] = defs
    return schema


def union_calls(union: dict[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(tool name, arguments schema) of each single-call branch of a :func:`union_schema`.

    For engines that constrain per tool (vLLM structural tags) and only see the constraint:
    the union's layout stays this module's business. An arguments schema may ``$ref`` into
    the union's ``$defs``; carry those along.
    """
    defs = union.get("$defs", {})
    calls = []
    for branch in union.get("anyOf", [union]):
        ref = branch.get("$ref", "")
        if ref.startswith("#/$defs/"):
            branch = defs[ref.removeprefix("#/$defs/")]
        props = branch.get("properties", {})
        if "tool" in props and "arguments" in props:
            calls.append((props["tool"]["const"], props["arguments"]))
    return tuple(calls)


def _call_branch(tool: ToolSpec, index: int, defs: dict[str, Any]) -> dict[str, Any]:
    """The envelope of one call of ``tool``, ``tools[index]`` in the request."""
    parameters = closed_schema(tool.parameters, param=f"tools[{index}].function.parameters")
    arguments = _embed(parameters, f"tool-{tool.name}", defs)
    return _closed_object({"tool": {"const": tool.name}, "arguments": arguments})


def _closed_object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _embed(schema: dict[str, Any], key: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` placed inside the union; with local ``$ref``s it moves to ``$defs[key]``,
    its refs rewritten as pointers from the union's root (:func:`pointer_refs`).

    Its root ``$id`` is dropped: kept, it made the embedded schema a resource of its own, and
    2020-12 resolves the rewritten ``#/$defs/<key>/...`` against that resource, where it
    dangles. Only local refs are allowed (runtime/schema_check.py), so nothing can name the
    schema by that URI."""
    body = {k: v for k, v in schema.items() if k not in ("$schema", "$id")}
    if not any(True for _ in refs_in(body)):
        return body
    defs[key] = pointer_refs(body, f"#/$defs/{key}")
    return {"$ref": f"#/$defs/{key}"}


__all__ = ["union_calls", "union_schema"]
