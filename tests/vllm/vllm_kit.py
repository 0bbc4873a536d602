"""Helpers shared by the vLLM tests: an engine bound to the session server, and sync runs."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from callproof.devvllm import VllmServer
from runtime.engines.vllm import VllmEngine

T = TypeVar("T")


def engine_for(server: VllmServer, **kwargs: Any) -> VllmEngine:
    """An engine for the server's model, digests computed from the served directory."""
    return VllmEngine(
        server.url, server.config.served_name, model_dir=server.config.model_dir, **kwargs
    )


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)
