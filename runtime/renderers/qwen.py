"""Qwen 2.5 / Qwen 3: the ``# Tools`` block of their chat template, ``<tool_call>`` tags.

Text follows the official Jinja template so the model sees exactly what it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.renderers.base import HistoryCall, HistoryMessage, Renderer, ToolPrompt, dumps


class QwenRenderer(Renderer):
    name = "qwen"

    def announce(self, prompt: ToolPrompt) -> str:
        lines = "\n".join(dumps(t.to_openai()) for t in prompt.tools)
        return (
            "# Tools\n\n"
            "You may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n"
            "<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>"
        )

    def call_object(self, call: HistoryCall) -> dict[str, Any]:
        return {"name": call.name, "arguments": call.arguments}

    def assistant_calls(self, content: str, calls: Sequence[HistoryCall]) -> str:
        parts = [content] if content else []
        parts += [f"<tool_call>\n{dumps(self.call_object(c))}\n</tool_call>" for c in calls]
        return "\n".join(parts)

    def result_body(self, result: HistoryMessage) -> str:
        return result.content

    def tool_results(self, results: Sequence[HistoryMessage]) -> str:
        return "\n".join(
            f"<tool_response>\n{self.result_body(r)}\n</tool_response>" for r in results
        )
