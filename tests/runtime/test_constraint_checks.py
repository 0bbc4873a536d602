"""ConstraintChecks: the vLLM engine's verdicts on constraints, refusals kept like passes,
each new constraint checked once on a deep-stack worker thread, never on the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

import runtime.constraint_checks as checks_module
from runtime.constraint import Constraint
from runtime.constraint_checks import ConstraintChecks
from runtime.errors import ConstraintUnsatisfiable, InvalidGrammar

EMPTY_ENUM = Constraint.json_schema({"enum": []})
BAD_GRAMMAR = Constraint.ebnf("start: foo")
FINE = Constraint.regex("[a-z]+")


def test_each_verdict_is_reached_once_off_the_loop_and_refusals_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Constraint, str]] = []
    validate = checks_module.validate_constraint

    def counted(constraint: Constraint) -> None:
        seen.append((constraint, threading.current_thread().name))
        validate(constraint)

    monkeypatch.setattr(checks_module, "validate_constraint", counted)
    checks = ConstraintChecks()

    async def go() -> None:
        for _ in range(3):
            with pytest.raises(ConstraintUnsatisfiable, match="admits no value"):
                await checks.check(EMPTY_ENUM)
            with pytest.raises(InvalidGrammar, match="unknown name"):
                await checks.check(BAD_GRAMMAR)
            await checks.check(FINE)

    try:
        asyncio.run(go())
    finally:
        checks.close()
    assert [c for c, _ in seen] == [EMPTY_ENUM, BAD_GRAMMAR, FINE]
    assert all(thread.startswith("checks") for _, thread in seen), seen


def test_the_oldest_verdict_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Constraint] = []
    monkeypatch.setattr(checks_module, "validate_constraint", seen.append)
    checks = ConstraintChecks(max_entries=2)
    a, b, c = (Constraint.regex(p) for p in ("a", "b", "c"))

    async def go() -> None:
        for constraint in (a, b, a, c, a, b):  # c pushes out b, the least recently used
            await checks.check(constraint)

    try:
        asyncio.run(go())
    finally:
        checks.close()
    assert seen == [a, b, c, b]
