"""Prompt rendering per model family: how tools, past calls and tool results are written.

The family comes from the model name; anything unrecognised gets the generic JSON envelope,
which needs no training on a tool format because the constraint enforces it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from runtime.renderers.base import HistoryMessage, Renderer, ToolPrompt, json_answer_note
from runtime.renderers.generic import GenericRenderer
from runtime.renderers.hermes import HermesRenderer
from runtime.renderers.llama import LlamaRenderer
from runtime.renderers.qwen import QwenRenderer
from runtime.tools import ResponseFormat, ToolSpec, parse_tool_choice

RENDERERS: dict[str, Renderer] = {
    r.name: r for r in (QwenRenderer(), LlamaRenderer(), HermesRenderer(), GenericRenderer())
}

# Order matters: Hermes-2-Pro ships Llama and Mistral variants ("Hermes-2-Pro-Llama-3-8B").
_FAMILY_PATTERNS = (
    ("hermes", re.compile(r"hermes")),
    ("qwen", re.compile(r"qwen")),
    ("llama", re.compile(r"llama[-_ ]?3")),
)


# Models that open every answer with a <think> region (the region stays free of the grammar).
_REASONING_PATTERN = re.compile(r"qwen3(?!.*instruct-2507)|qwq|deepseek-r1|thinking")


def detect_reasoning(model_name: str) -> bool:
    """True for thinking models, whose output starts with a free ``<think>`` region."""
    return bool(_REASONING_PATTERN.search(model_name.lower().rstrip("/").rsplit("/", 1)[-1]))


def detect_family(model_name: str) -> str:
    """ "qwen" | "llama" | "hermes" | "generic" from a model name, path or family name."""
    name = model_name.lower().rstrip("/").rsplit("/", 1)[-1]
    for family, pattern in _FAMILY_PATTERNS:
        if pattern.search(name):
            return family
    return "generic"


def get_renderer(family: str) -> Renderer:
    try:
        return RENDERERS[family]
    except KeyError:
        raise ValueError(f"unknown renderer {family!r}; known: {', '.join(RENDERERS)}") from None


def render_tool_prompt(
    tools: Sequence[ToolSpec],
    model_hint: str,
    *,
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = False,
    response_format: ResponseFormat | None = None,
) -> str:
    """The system-prompt block announcing ``tools`` in the format of ``model_hint``'s family."""
    prompt = ToolPrompt(
        tuple(tools),
        parse_tool_choice(tool_choice, tools),
        parallel_tool_calls,
        response_format.schema if response_format is not None else None,
    )
    return get_renderer(detect_family(model_hint)).tool_block(prompt)


__all__ = [
    "RENDERERS",
    "HistoryMessage",
    "Renderer",
    "ToolPrompt",
    "detect_family",
    "get_renderer",
    "json_answer_note",
    "render_tool_prompt",
]
