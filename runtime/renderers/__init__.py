"""Prompt rendering per model family: how tools, past calls and tool results are written.

The family comes from the model name; anything unrecognised gets the generic JSON envelope,
which needs no training on a tool format because the constraint enforces it.
"""

from __future__ import annotations

import re

from runtime.renderers.base import (
    HistoryCall,
    HistoryMessage,
    Renderer,
    ToolPrompt,
    json_answer_note,
)
from runtime.renderers.generic import GenericRenderer
from runtime.renderers.hermes import HermesRenderer
from runtime.renderers.llama import LlamaRenderer
from runtime.renderers.qwen import QwenRenderer

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


def thinks(model_name: str | None, reasoning: bool | None) -> bool:
    """Whether the model is a thinking model: ``reasoning`` when set, else its name says."""
    return detect_reasoning(model_name or "") if reasoning is None else reasoning


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


__all__ = [
    "RENDERERS",
    "HistoryCall",
    "HistoryMessage",
    "Renderer",
    "ToolPrompt",
    "detect_family",
    "detect_reasoning",
    "get_renderer",
    "json_answer_note",
    "thinks",
]
