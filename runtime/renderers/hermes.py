"""Hermes-2-Pro: Qwen-style ``<tool_call>`` tags with its own, longer system framing.

The framing, the pydantic call schema it quotes and the ``{"name", "content"}`` tool
response follow NousResearch's Hermes-Function-Calling prompt format.
"""

from __future__ import annotations

from typing import Any

from runtime.renderers.base import HistoryCall, HistoryMessage, ToolPrompt, dumps
from runtime.renderers.qwen import QwenRenderer

_CALL_SCHEMA = {
    "properties": {
        "arguments": {"title": "Arguments", "type": "object"},
        "name": {"title": "Name", "type": "string"},
    },
    "required": ["arguments", "name"],
    "title": "FunctionCall",
    "type": "object",
}


class HermesRenderer(QwenRenderer):
    name = "hermes"

    def announce(self, prompt: ToolPrompt) -> str:
        tools = " ".join(dumps(t.to_openai()) for t in prompt.tools)
        return (
            "You are a function calling AI model. You are provided with function signatures "
            "within <tools></tools> XML tags. You may call one or more functions to assist "
            "with the user query. Don't make assumptions about what values to plug into "
            f"functions. Here are the available tools: <tools> {tools} </tools> "
            "Use the following pydantic model json schema for each tool call you will make: "
            f"{dumps(_CALL_SCHEMA)} For each function call return a json object with function "
            "name and arguments within <tool_call></tool_call> XML tags as follows:\n"
            "<tool_call>\n"
            '{"arguments": <args-dict>, "name": <function-name>}\n'
            "</tool_call>"
        )

    def call_object(self, call: HistoryCall) -> dict[str, Any]:
        return {"arguments": call.arguments, "name": call.name}

    def result_body(self, result: HistoryMessage) -> str:
        return dumps({"name": result.name or "", "content": result.content})
