"""The size-bounded memo behind the schema checks and validators."""

from __future__ import annotations

import pytest

from runtime.bounded_cache import ENTRY_OVERHEAD, SizeBoundedMemo
from runtime.schema_check import _validator, validate


def test_entries_go_least_recently_used_first_by_bytes_and_by_count() -> None:
    built: list[str] = []

    def build(text: str) -> str:
        built.append(text)
        return text.upper()

    memo = SizeBoundedMemo(build, len, max_entries=3, max_bytes=2 * (ENTRY_OVERHEAD + 100))
    assert memo("a" * 100) == "A" * 100 and memo("b" * 100) == "B" * 100
    assert memo("a" * 100) == "A" * 100  # kept, and now the most recently used
    memo("c" * 100)  # over max_bytes: "b" goes, not "a"
    assert len(memo) == 2 and memo.weight <= memo.max_bytes
    memo("a" * 100)
    memo("b" * 100)
    assert built == ["a" * 100, "b" * 100, "c" * 100, "b" * 100]
    counted = SizeBoundedMemo(build, len, max_entries=3, max_bytes=1 << 20)
    for text in ("x", "y", "z", "w"):
        counted(text)
    assert len(counted) == 3


def test_a_call_that_raises_is_not_kept() -> None:
    calls = 0

    def fail(text: str) -> None:
        nonlocal calls
        calls += 1
        raise ValueError(text)

    memo = SizeBoundedMemo(fail, len, max_entries=4, max_bytes=1 << 20)
    for _ in range(2):
        with pytest.raises(ValueError):
            memo("bad")
    assert calls == 2 and len(memo) == 0


def test_validators_of_many_large_schemas_stay_within_their_budget() -> None:
    """1,024 validators of 63 KB tool unions held 400 MB; the budget is in bytes now."""
    for i in range(30):
        schema = {
            "type": "object",
            "properties": {
                f"p{j}_{i}": {"type": "string", "description": "x" * 4000} for j in range(80)
            },
        }
        validate({}, schema, "{}", param="tools")
    assert _validator.weight <= _validator.max_bytes
    assert len(_validator) < 30
