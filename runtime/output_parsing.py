"""Parsing model output back into what it means: tool calls, an answer, a structured value.

Under tools the model writes the JSON envelope :func:`runtime.union_schema.union_schema`
describes (``{"tool", "arguments"}``, ``{"tool_calls": [...]}`` or ``{"answer": ...}``);
thinking models may instead write calls in their family's own tags
(:func:`parse_native_tool_call`).
Everything the constrained decoder produced is validated again here with jsonschema-rs
(defence in depth: a backend bug must not turn into a receipt for arguments that fail their
schema).

Each call's id comes from the request's :class:`runtime.call_ids.CallIds`, by call index, so
re-parsing the same output (retry, stream then final parse) keeps every id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from runtime.call_ids import CallIds
from runtime.errors import StructuredOutputInvalid
from runtime.exact_json import EXACT_JSON, load_json
from runtime.schema_check import validate
from runtime.tools import ToolSpec

# --------------------------------------------------------------------------- parsed output


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    text: str | None = None  # the arguments as the model wrote them, when it wrote JSON text

    def arguments_json(self) -> str:
        """The arguments as OpenAI returns them, a string: the model's own JSON text, which
        is what a stream sends; compact JSON when the model's format had none."""
        if self.text is not None:
            return self.text
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))

    def written_as(self, text: str | None) -> ToolCall:
        """This call with the model's JSON text of its arguments (None: keep it as is)."""
        return self if text is None else replace(self, text=text)

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json()},
        }


ResponseKind = Literal["tool_calls", "answer", "parsed", "text"]


@dataclass(frozen=True)
class ParsedResponse:
    """What a model output means: calls, a plain answer, a structured value, or free text.

    ``content`` is what an OpenAI response carries as ``message.content`` (None for calls
    without text); ``parsed`` is set only for structured content, never for tool calls.
    ``complete`` is False for text cut off (token limit, stop string) before its constraint
    was satisfied: returned as far as it got, as OpenAI does, but it conforms to nothing.
    """

    kind: ResponseKind
    answer: str | None = None
    parsed: Any = None
    tool_calls: tuple[ToolCall, ...] = ()
    content: str | None = None
    reasoning: str | None = None
    complete: bool = True


def parse_envelope(
    text: str,
    tools: Sequence[ToolSpec],
    *,
    schema: dict[str, Any] | None = None,
    response_schema: dict[str, Any] | None = None,
    ids: CallIds | None = None,
) -> ParsedResponse:
    """Parse and re-validate the JSON envelope produced under
    :func:`runtime.union_schema.union_schema`.

    ``schema`` (the union) catches what per-part checks cannot, such as an answer under
    tool_choice "required"; ``response_schema`` marks the answer as structured content.
    A failure names ``tools`` (the field that shaped the envelope), but an answer failing
    ``response_schema`` names ``response_format``.
    """
    envelope = load_json(text, schema or {}, param="tools")
    return _from_envelope(envelope, text, tools, schema, response_schema, ids or CallIds())


_SPACE = re.compile(r"[ \t\n\r]*")


def envelope_texts(text: str) -> dict[tuple[str | int, ...], str]:
    """The JSON text of each value of the envelope `text` (valid JSON), by path: ("answer",),
    ("arguments",), ("tool_calls", 0, "arguments")... As the model wrote them, which is what
    runtime/streaming.py sends, so a response and its stream carry the same bytes (a number
    written 1.50 stays 1.50). Only the envelope's object and the tool_calls array are walked;
    every other value is one raw_decode."""
    found: dict[tuple[str | int, ...], str] = {}

    def skip(i: int) -> int:
        return _SPACE.match(text, i).end()  # type: ignore[union-attr]  # * always matches

    def value(i: int, path: tuple[str | int, ...]) -> int:
        i = skip(i)
        walked = path == () or (len(path) == 2 and path[0] == "tool_calls")
        if walked and text.startswith("{", i):
            return members(i, path, "}")
        if path == ("tool_calls",) and text.startswith("[", i):
            return members(i, path, "]")
        end = EXACT_JSON.raw_decode(text, i)[1]
        found[path] = text[i:end]
        return end

    def members(i: int, path: tuple[str | int, ...], close: str) -> int:
        i = skip(i + 1)
        index = 0
        while not text.startswith(close, i):
            if close == "}":
                key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
                i = value(skip(i) + 1, (*path, key))  # past the ':'
            else:
                i = value(i, (*path, index))
                index += 1
            i = skip(i)
            if text.startswith(",", i):
                i = skip(i + 1)
        return i + 1

    value(0, ())
    return found


def _from_envelope(
    envelope: Any,
    raw: str,
    tools: Sequence[ToolSpec],
    schema: dict[str, Any] | None,
    response_schema: dict[str, Any] | None,
    ids: CallIds,
) -> ParsedResponse:
    union = schema or {}
    if not isinstance(envelope, dict):
        raise _invalid_tool_output("tool envelope is not a JSON object", raw, union)
    by_name = {t.name: t for t in tools}
    # each call with its JSON pointer (for errors) and its envelope_texts path
    items: list[tuple[str, tuple[str | int, ...], Any]]
    if "tool_calls" in envelope and isinstance(envelope["tool_calls"], list):
        items = [
            (f"/tool_calls/{i}", ("tool_calls", i), c) for i, c in enumerate(envelope["tool_calls"])
        ]
    elif "tool" in envelope:
        items = [("", (), envelope)]
    else:
        items = []
    texts = envelope_texts(raw) if items or response_schema is not None else {}
    calls = tuple(
        _call_from(item, at, by_name, raw, union, ids.for_index(i)).written_as(
            texts.get((*path, "arguments"))
        )
        for i, (at, path, item) in enumerate(items)
    )
    if not calls and response_schema is not None and "answer" in envelope:
        # before the union, whose anyOf could only say the whole envelope fails
        validate(
            envelope["answer"], response_schema, raw, param="response_format", prefix="/answer"
        )
    if schema is not None:
        validate(envelope, schema, raw, param="tools")
    if calls:
        return ParsedResponse("tool_calls", tool_calls=calls)
    if "answer" not in envelope:
        raise _invalid_tool_output(
            "tool envelope has none of 'tool', 'tool_calls', 'answer'", raw, union
        )
    answer = envelope["answer"]
    if response_schema is not None:
        return ParsedResponse("parsed", parsed=answer, content=texts[("answer",)])
    if not isinstance(answer, str):
        raise _invalid_tool_output("'answer' must be a string", raw, union, "/answer")
    return ParsedResponse("answer", answer=answer, content=answer)


def _invalid_tool_output(
    message: str, raw: str, union: dict[str, Any], pointer: str = ""
) -> StructuredOutputInvalid:
    """Model output (an envelope or a native call) that breaks the tool union: a 422 that
    names the ``tools`` field."""
    return StructuredOutputInvalid(
        message, schema=union, raw_output=raw, pointer=pointer, param="tools"
    )


def _call_from(
    item: Any,
    at: str,
    by_name: Mapping[str, ToolSpec],
    raw: str,
    union: dict[str, Any],
    call_id: str,
    name_key: str = "tool",
) -> ToolCall:
    if not isinstance(item, dict):
        raise _invalid_tool_output("a tool call is not a JSON object", raw, union, at)
    name = item.get(name_key)
    tool = by_name.get(name) if isinstance(name, str) else None
    if tool is None:
        raise _invalid_tool_output(
            f"the output calls unknown tool {name!r}", raw, union, f"{at}/{name_key}"
        )
    arguments = item.get("arguments", {})
    if isinstance(arguments, str):  # some native formats carry arguments as a JSON string
        arguments = load_json(arguments, tool.parameters, param="tools", pointer=f"{at}/arguments")
    validate(arguments, tool.parameters, raw, param="tools", prefix=f"{at}/arguments")
    return ToolCall(call_id, tool.name, arguments)


# --------------------------------------------------------------------------- native formats

# Qwen 2.5/3 and Hermes-2-Pro: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
_TOOL_CALL_TAGS = re.compile(r"<tool_call>\s*(?P<body>\{.*?\})\s*</tool_call>", re.DOTALL)
_NATIVE_PATTERNS = {
    "qwen": _TOOL_CALL_TAGS,
    "hermes": _TOOL_CALL_TAGS,
    # Llama 3.1/3.2 custom tools: <function=NAME>{...}</function>
    "llama": re.compile(
        r"<function=(?P<name>[a-zA-Z0-9_-]{1,64})>(?P<body>.*?)</function>", re.DOTALL
    ),
}


def parse_native_tool_call(
    text: str,
    family: str,
    tools: Sequence[ToolSpec],
    *,
    ids: CallIds | None = None,
) -> ParsedResponse:
    """Calls written in a family's own tags (unconstrained or trigger-constrained output).

    Inside Qwen/Hermes tags both ``{"name", "arguments"}`` (the trained format) and the
    envelope (``{"tool", "arguments"}`` or ``{"tool_calls": [...]}``) are accepted; text
    outside the tags is kept as content. Output without any call is returned as kind "text".
    The generic family has no tags: its output is the envelope itself.
    """
    ids = ids or CallIds()
    if family == "generic":
        return parse_envelope(text, tools, ids=ids)
    pattern = _NATIVE_PATTERNS.get(family)
    if pattern is None:
        raise ValueError(f"unknown tool-call family {family!r}")
    items: list[Any] = []
    for match in pattern.finditer(text):
        at = f"/tool_calls/{len(items)}"
        if family == "llama":
            arguments = load_json(
                match["body"].strip() or "{}", {}, param="tools", pointer=f"{at}/arguments"
            )
            items.append({"name": match["name"], "arguments": arguments})
            continue
        body = load_json(match["body"], {}, param="tools", pointer=at)
        several = body.get("tool_calls") if isinstance(body, dict) else None
        items.extend(several if isinstance(several, list) else [body])
    by_name = {t.name: t for t in tools}
    calls = [
        _call_from(
            item,
            f"/tool_calls/{i}",
            by_name,
            text,
            {},
            ids.for_index(i),
            name_key="tool" if isinstance(item, dict) and "tool" in item else "name",
        )
        for i, item in enumerate(items)
    ]
    rest = pattern.sub("", text).strip()
    if not calls:
        return ParsedResponse("text", content=text)
    return ParsedResponse("tool_calls", tool_calls=tuple(calls), content=rest or None)


__all__ = [
    "ParsedResponse",
    "ToolCall",
    "parse_envelope",
    "parse_native_tool_call",
]
