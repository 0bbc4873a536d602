"""The layout's rules (docs/architecture.md): runtime/ and receipts/ never import gateway/ or
each other, and none of the three imports the console script's package (callproof/), so the
few rules both runtime/ and receipts/ must apply are written twice and held equal here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from receipts.canonical import MAX_SAFE_INT
from receipts.record import LINKED_CALL_ID
from runtime.exact_json import MAX_EXACT_INTEGER
from runtime.messages import ANSWERED_CALL_ID

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "runtime": {"gateway", "receipts", "callproof"},
    "receipts": {"gateway", "runtime", "callproof"},
    "gateway": {"callproof"},  # the console script sits above the three packages
}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert not {path: names for path, names in offenders.items() if names}


def test_rules_both_sides_apply_are_the_same() -> None:
    """A tool message's tool_call_id the runtime accepts must be one the ledger records, or a
    request would be generated and then refused; a number is exact up to the same bound."""
    assert ANSWERED_CALL_ID.pattern == LINKED_CALL_ID.pattern
    assert MAX_EXACT_INTEGER == MAX_SAFE_INT
