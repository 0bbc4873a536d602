"""Constraint checks for an engine that compiles nothing itself (vLLM compiles on its
server): validate_constraint's verdict per constraint, refusals included, the way the grammar
cache keeps compiles for the embedded engine. So both engines refuse bad input alike, a
constraint is checked once, and the check runs on a deep-stack thread (the grammar parsers
recurse in native code), never on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict

from runtime.constraint import Constraint, validate_constraint
from runtime.deep_stack import DeepStackExecutor
from runtime.errors import RuntimeInputError

_UNSEEN = object()


class ConstraintChecks:
    """Bounded (LRU) verdicts of validate_constraint: None, or the typed error to raise."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._verdicts: OrderedDict[Constraint, RuntimeInputError | None] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: DeepStackExecutor | None = None

    async def check(self, constraint: Constraint) -> None:
        """Raise the constraint's typed error (invalid, unsatisfiable), if it has one."""
        with self._lock:
            verdict = self._verdicts.get(constraint, _UNSEEN)
            if verdict is not _UNSEEN:
                self._verdicts.move_to_end(constraint)
            elif self._pool is None:
                self._pool = DeepStackExecutor(max_workers=1, thread_name_prefix="checks")
            pool = self._pool
        if verdict is _UNSEEN:
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(pool, _verdict, constraint)
            with self._lock:
                self._verdicts[constraint] = verdict
                if len(self._verdicts) > self.max_entries:
                    self._verdicts.popitem(last=False)
        if verdict is not None:
            raise verdict.with_traceback(None)  # the same error each time, not a longer trace

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _verdict(constraint: Constraint) -> RuntimeInputError | None:
    try:
        validate_constraint(constraint)
    except RuntimeInputError as exc:
        return exc
    return None
