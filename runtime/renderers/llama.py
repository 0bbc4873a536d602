"""Llama 3.1 / 3.2: custom tools announced in the system prompt, called as
``<function=NAME>{...}</function>`` (Meta's documented format for user-defined functions).

Llama's template gives tool results the ``ipython`` role; engines only know
system/user/assistant, so results arrive as a user turn naming the function and call id.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.renderers.base import HistoryCall, HistoryMessage, Renderer, ToolPrompt, dumps


class LlamaRenderer(Renderer):
    name = "llama"

    def announce(self, prompt: ToolPrompt) -> str:
        tools = "\n\n".join(
            f"Use the function '{t.name}' to '{t.description}'\n"
            + dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
            for t in prompt.tools
        )
        one_at_a_time = (
            "- You may call several functions, one per line"
            if prompt.parallel
            else "- Only call one function at a time"
        )
        return (
            "You have access to the following functions:\n\n"
            f"{tools}\n\n"
            "If you choose to call a function ONLY reply in the following format:\n"
            "<{start_tag}={function_name}>{parameters}{end_tag}\n"
            "where\n\n"
            "start_tag => `<function`\n"
            "parameters => a JSON dict with the function argument name as key and function "
            "argument value as value.\n"
            "end_tag => `</function>`\n\n"
            "Here is an example,\n"
            '<function=example_function_name>{"example_name": "example_value"}</function>\n\n'
            "Reminder:\n"
            "- Function calls MUST follow the specified format\n"
            "- Required parameters MUST be specified\n"
            f"{one_at_a_time}\n"
            "- Put the entire function call reply on one line"
        )

    def assistant_calls(self, content: str, calls: Sequence[HistoryCall]) -> str:
        parts = [content] if content else []
        parts += [f"<function={c.name}>{dumps(c.arguments)}</function>" for c in calls]
        return "\n".join(parts)

    def tool_results(self, results: Sequence[HistoryMessage]) -> str:
        return "\n\n".join(
            f"Result of function {r.name or 'unknown'} (call id {r.tool_call_id}):\n{r.content}"
            for r in results
        )
