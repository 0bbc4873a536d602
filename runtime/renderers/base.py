"""What every family renderer shares: the validated conversation it receives, the tool
prompt it renders, and the walk that turns history into plain engine messages.

A family only decides *text*: how tools are announced in the system prompt, how its own past
calls looked, and how tool results are framed. Engines see nothing but system/user/assistant
``ChatMessage``s, so tool results become user turns in the family's framing.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from runtime.engines.base import ChatMessage
from runtime.tools import ResponseFormat, ToolChoice, ToolSpec


@dataclass(frozen=True)
class HistoryCall:
    """A tool call of an earlier assistant turn, as the client sends it back. ``arguments``
    is the JSON object its arguments string holds, or that string itself when it holds none
    (a call cut off or invalid, as LangChain re-sends it, or another provider's): OpenAI
    takes any string there, and in a history it is only prompt text."""

    id: str
    name: str
    arguments: dict[str, Any] | str


@dataclass(frozen=True)
class HistoryMessage:
    """One validated OpenAI message ("developer" already folded into "system")."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[HistoryCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None  # tool messages: the function whose result this is, when known


@dataclass(frozen=True)
class ToolPrompt:
    """The tools as the model is told about them, with the request's tool_choice applied."""

    tools: tuple[ToolSpec, ...]
    choice: ToolChoice
    parallel: bool = False
    answer_format: ResponseFormat | None = None  # the response_format an answer follows


def dumps(value: Any) -> str:
    """JSON as chat templates print it (``tojson``: ", " and ": " separators, no escaping)."""
    return json.dumps(value, ensure_ascii=False)


def choice_hint(prompt: ToolPrompt) -> str:
    """One sentence telling the model what tool_choice demands ("" for auto on every tool)."""
    if prompt.choice.mode == "none":
        return "Do not call any function now; answer the user directly."
    allowed = prompt.choice.allowed
    if prompt.choice.mode == "required":
        if allowed is not None:
            return f"You must call at least one of these functions: {', '.join(allowed)}."
        return "You must call at least one of the functions."
    if prompt.choice.mode == "named":
        return f"You must call the function {prompt.choice.name}."
    if allowed is not None:
        return f"You may call only these functions: {', '.join(allowed)}."
    return ""


class Renderer(ABC):
    """A model family's tool-calling format."""

    name: str

    def tool_block(self, prompt: ToolPrompt) -> str:
        """The system-prompt section announcing the tools, then (when an answer is allowed)
        the answer's format and what it is for, ending with what tool_choice asks."""
        answer = ""
        if prompt.choice.allows_answer:
            notes = (self.answer_note(prompt), format_purpose(prompt.answer_format))
            answer = "\n\n".join(note for note in notes if note)
        return "\n\n".join(
            part for part in (self.announce(prompt), answer, choice_hint(prompt)) if part
        )

    def answer_note(self, prompt: ToolPrompt) -> str:
        """What an answer instead of a call must look like when response_format makes it
        JSON ("" for a free-text answer). A family's own tool format says nothing of answers,
        and the decoder enforces the schema whether or not the model was told it."""
        schema = prompt.answer_format.schema if prompt.answer_format else None
        if schema is None:
            return ""
        return f"When you answer instead of calling a function, {_json_only(schema)}"

    @abstractmethod
    def announce(self, prompt: ToolPrompt) -> str:
        """The family's own text listing the tools and how to call them."""

    @abstractmethod
    def assistant_calls(self, content: str, calls: Sequence[HistoryCall]) -> str:
        """An assistant turn with calls, as the model itself would have written it; arguments
        that are a string (no JSON object) are written as a JSON string, as chat templates'
        ``tojson`` writes them."""

    @abstractmethod
    def tool_results(self, results: Sequence[HistoryMessage]) -> str:
        """Consecutive tool messages, framed as one user turn."""

    def render(
        self, history: Sequence[HistoryMessage], system_block: str = ""
    ) -> tuple[ChatMessage, ...]:
        """History -> engine messages; ``system_block`` is merged into the leading system turn."""
        out: list[ChatMessage] = []
        if system_block and not (history and history[0].role == "system"):
            out.append(ChatMessage("system", system_block))
        pending: list[HistoryMessage] = []
        for i, msg in enumerate(history):
            if msg.role == "tool":
                pending.append(msg)
                continue
            if pending:
                out.append(ChatMessage("user", self.tool_results(pending)))
                pending = []
            if msg.role == "system":
                text = msg.content
                if i == 0 and system_block:
                    text = f"{text}\n\n{system_block}" if text else system_block
                out.append(ChatMessage("system", text))
            elif msg.role == "assistant" and msg.tool_calls:
                out.append(
                    ChatMessage("assistant", self.assistant_calls(msg.content, msg.tool_calls))
                )
            else:
                out.append(ChatMessage(msg.role, msg.content))
        if pending:
            out.append(ChatMessage("user", self.tool_results(pending)))
        return tuple(out)


def format_purpose(response_format: ResponseFormat | None) -> str:
    """The client's description of its response format, under the format's name ("" when
    it gives none): OpenAI's model reads it "to determine how to respond in the format", and
    pydantic-ai sends the output model's docstring there. Without a description the prompt
    is unchanged, so earlier receipts replay to the same prompt."""
    if response_format is None or not response_format.description:
        return ""
    name = f' "{response_format.name}"' if response_format.name else ""
    return f"Response format{name}: {response_format.description}"


def json_answer_note(schema: dict[str, Any], response_format: ResponseFormat) -> str:
    """System note for response_format without tools: the model learns what fields mean
    (``schema``, as enforced) and what the format is for."""
    note = _json_only(schema)
    note = note[0].upper() + note[1:]
    purpose = format_purpose(response_format)
    return f"{note}\n\n{purpose}" if purpose else note


def _json_only(schema: dict[str, Any]) -> str:
    """The instruction to write JSON alone, quoting the schema unless it is json_object's."""
    if schema == {"type": "object"}:
        return "respond with a single JSON object and nothing else."
    return (
        "respond with a single JSON value and nothing else. It must match this JSON schema:\n"
        + dumps(schema)
    )
