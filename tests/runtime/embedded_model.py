"""The one real SmolLM2 engine the model tests share (loading it costs seconds and 540 MB).

Not a conftest: each model test module asks for it through its own session fixture, and
the cache below makes them all share one instance.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any, TypeVar

from runtime.engines.embedded import EmbeddedEngine
from runtime.model_store import ensure_bundled_model

T = TypeVar("T")


@functools.cache
def shared_engine() -> EmbeddedEngine:
    """The bundled model with the default backend order (fetched if setup has not)."""
    ensure_bundled_model()
    return EmbeddedEngine.load()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Each test drives the engine from its own event loop, as separate requests would."""
    return asyncio.run(coro)
