"""Any other model (SmolLM2 among them): plain-language instructions for the JSON envelope.

The envelope is exactly what the union schema constrains the decoder to, so the prompt and
the constraint agree; past calls are shown as the envelope the model produced, and results
name the call id they answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.renderers.base import HistoryCall, HistoryMessage, Renderer, ToolPrompt, dumps


class GenericRenderer(Renderer):
    name = "generic"

    def announce(self, prompt: ToolPrompt) -> str:
        listing = "\n".join(
            dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
            for t in prompt.tools
        )
        forms: list[str] = []
        if prompt.choice.allows_calls:
            tool = prompt.choice.name or "<tool name>"
            forms.append(
                "When a tool matches the request, call it with JSON: "
                f'{{"tool": "{tool}", "arguments": {{<arguments>}}}}'
            )
            if prompt.parallel:
                forms.append(
                    "To call several tools at once: "
                    f'{{"tool_calls": [{{"tool": "{tool}", "arguments": {{<arguments>}}}}, ...]}}'
                )
        if prompt.choice.allows_answer:
            schema = prompt.answer_format.schema if prompt.answer_format else None
            value = (
                '"<text>"' if schema is None else f"<JSON matching this schema: {dumps(schema)}>"
            )
            lead = "When no tool matches, answer" if prompt.choice.allows_calls else "Answer"
            forms.append(f'{lead} with JSON: {{"answer": {value}}}')
        return f"You have access to these tools:\n{listing}\n\n" + "\n".join(forms)

    def answer_note(self, prompt: ToolPrompt) -> str:
        """ "": the envelope's answer form in ``announce`` already quotes the schema."""
        return ""

    def assistant_calls(self, content: str, calls: Sequence[HistoryCall]) -> str:
        envelopes: list[dict[str, Any]] = [
            {"tool": c.name, "arguments": c.arguments} for c in calls
        ]
        return dumps(envelopes[0] if len(envelopes) == 1 else {"tool_calls": envelopes})

    def tool_results(self, results: Sequence[HistoryMessage]) -> str:
        return "\n".join(
            f"Tool result for {r.tool_call_id} ({r.name or 'unknown tool'}): {r.content}"
            for r in results
        )
