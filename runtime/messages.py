"""The messages of an OpenAI chat request, validated into the renderers' HistoryMessage: each
fault is a typed 4xx naming the message and member at fault, found before any planning."""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.errors import RuntimeInputError, UnsupportedParameter
from runtime.renderers import HistoryCall, HistoryMessage

# A call id a tool message may answer: any client's (the receipt links it), within bounds.
ANSWERED_CALL_ID = re.compile(r"[\x20-\x7e]{1,64}")
ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_messages(messages: Any) -> tuple[HistoryMessage, ...]:
    """Validate OpenAI ``messages``; "developer" becomes "system" and each tool result
    learns the name of the function whose call it answers."""
    if not isinstance(messages, list) or not messages:
        raise RuntimeInputError("'messages' must be a non-empty array", param="messages")
    names: dict[str, str] = {}
    out: list[HistoryMessage] = []
    for i, msg in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RuntimeInputError(f"'{at}' must be an object", param=at)
        role = msg.get("role")
        if role not in ROLES:
            raise RuntimeInputError(
                f"'{at}.role' must be one of {', '.join(ROLES)}; got {role!r}", param=f"{at}.role"
            )
        for member, use in (("function_call", "tool_calls"), ("audio", "text content")):
            if msg.get(member) is not None:
                raise UnsupportedParameter(
                    f"'{at}.{member}' is not supported here; send {use} instead",
                    param=f"{at}.{member}",
                )
        content = _content(msg.get("content"), f"{at}.content", assistant=role == "assistant")
        if role == "assistant" and not content and isinstance(msg.get("refusal"), str):
            content = msg["refusal"]  # what that turn said
        if role == "assistant":
            calls = _history_calls(msg.get("tool_calls"), at)
            names.update((c.id, c.name) for c in calls)
            out.append(HistoryMessage("assistant", content, tool_calls=calls))
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RuntimeInputError(
                    f"'{at}.tool_call_id' is required for role 'tool'", param=f"{at}.tool_call_id"
                )
            if not ANSWERED_CALL_ID.fullmatch(call_id):
                why = f"{len(call_id)} characters" if len(call_id) > 64 else "other characters"
                raise RuntimeInputError(
                    f"'{at}.tool_call_id' must be 1-64 printable ASCII characters (the id of"
                    f" the call it answers), got {why}",
                    param=f"{at}.tool_call_id",
                )
            legacy_name = msg.get("name") if isinstance(msg.get("name"), str) else None
            name = names.get(call_id, legacy_name)
            out.append(HistoryMessage("tool", content, tool_call_id=call_id, name=name))
        else:
            out.append(HistoryMessage("system" if role == "developer" else role, content))
    return tuple(out)


def _content(value: Any, at: str, *, assistant: bool) -> str:
    """A message's text; an assistant's may be absent and may hold refusal parts (what that
    turn said, as the SDK's message type allows)."""
    if isinstance(value, str):
        return value
    if value is None and assistant:
        return ""
    if not isinstance(value, list):
        raise RuntimeInputError(f"'{at}' must be a string or an array of text parts", param=at)
    texts: list[str] = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" and not (kind == "refusal" and assistant):
            raise UnsupportedParameter(
                f"'{at}[{j}].type' {kind!r} is not supported: only text parts are"
                + (" (and refusal parts)" if assistant else ""),
                param=f"{at}[{j}].type",
            )
        if not isinstance(part.get(kind), str):
            raise RuntimeInputError(
                f"'{at}[{j}].{kind}' must be a string", param=f"{at}[{j}].{kind}"
            )
        texts.append(part[kind])
    return "\n".join(texts)


def _history_calls(value: Any, at: str) -> tuple[HistoryCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RuntimeInputError(f"'{at}.tool_calls' must be an array", param=f"{at}.tool_calls")
    calls: list[HistoryCall] = []
    for j, call in enumerate(value):
        where = f"{at}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        call_id = call.get("id") if isinstance(call, dict) else None
        if not isinstance(call_id, str) or not isinstance(fn, dict):
            raise RuntimeInputError(
                f"'{where}' must be an object with 'id' and 'function'", param=where
            )
        name, raw = fn.get("name"), fn.get("arguments")
        if raw is None or raw == "":  # a no-argument tool's call
            raw = "{}"
        if not isinstance(name, str):
            raise RuntimeInputError(
                f"'{where}.function.name' must be a string", param=f"{where}.function.name"
            )
        if not isinstance(raw, str):
            raise RuntimeInputError(
                f"'{where}.function.arguments' must be a string (JSON text, as the model wrote it)",
                param=f"{where}.function.arguments",
            )
        calls.append(HistoryCall(call_id, name, _arguments(raw)))
    return tuple(calls)


def _arguments(raw: str) -> dict[str, Any] | str:
    """The object a past call's arguments string holds, or the string itself: a call cut off
    or invalid (``{"city": "Par``) is re-sent as it was written, and is only prompt text."""
    try:
        arguments = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        return raw
    return arguments if isinstance(arguments, dict) else raw


__all__ = ["ANSWERED_CALL_ID", "ROLES", "parse_messages"]
