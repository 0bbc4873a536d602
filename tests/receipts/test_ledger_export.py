"""Exports of chains whose receipts bind many distinct tool sets (an agent whose tool
descriptions change from call to call binds a new schema each time): the schemas stream from
the database, and a range too large for one bundle is refused before a byte is written."""

from __future__ import annotations

import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ledger_kit import draft, ledger, migrated, tool_union

from callproof.cli import main
from receipts.bundle_verify import verify_bundle
from receipts.errors import BundleTooLarge
from receipts.ledger import Ledger
from receipts.signing import Signer


def append_distinct(led: Ledger, count: int, size: int, start: int = 0) -> None:
    """``count`` receipts, each binding a tool union of its own of about ``size`` bytes."""
    futures = []
    for i in range(start, start + count):
        params = {
            "type": "object",
            "properties": {"city": {"type": "string", "description": f"{i} " + "x" * size}},
            "required": ["city"],
        }
        futures.append(led.submit(draft(schema=tool_union(get_weather=params))))
    for future in futures:
        future.result()


def test_an_export_holds_one_chunk_of_schemas_at_a_time(db_url: str, tmp_path: Path) -> None:
    """Every schema of the range was loaded and parsed before the first byte (some 550 MB
    for 264 MB of schemas); the writer now reads them twice from the database instead."""
    signer = Signer.generate()
    with ledger(migrated(db_url), signer) as led:
        append_distinct(led, 300, 50_000)  # 15 MB of schemas
        tracemalloc.start()
        try:
            led.export("acme", tmp_path / "bundle.tar.gz")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 10 << 20, f"the export held {peak >> 20} MiB"
    report = verify_bundle(tmp_path / "bundle.tar.gz", signer.public_key_pem())
    assert report.ok and report.checked == 300, report


def test_a_range_too_large_for_one_bundle_is_refused_and_shorter_ones_export(
    fresh_sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4,400 distinct 60 KB tool unions are more than the 256 MiB of schemas a bundle may
    hold (what `callproof verify` reads into memory): the whole chain's export wrote a bundle
    its verifier refused. It is now refused, naming the range and what to do, and each half
    of the chain (by time) exports as a bundle that verifies."""
    signer = Signer.generate()
    with ledger(migrated(fresh_sqlite_url), signer) as led:
        append_distinct(led, 2200, 60_000)
        time.sleep(0.01)
        middle = datetime.now(UTC)
        time.sleep(0.01)
        append_distinct(led, 2200, 60_000, start=2200)
        whole = tmp_path / "whole.tar.gz"
        with pytest.raises(BundleTooLarge) as refused:
            led.export("acme", whole)
        assert not whole.exists()
        assert str(refused.value).startswith("a bundle of seqs 1..4400 of chain 'acme' would hold")
        assert "would hold more than 256 MiB of files other than receipts.jsonl" in str(
            refused.value
        )
        key = tmp_path / "signing.pem"
        key.write_bytes(signer.private_key_pem())
        argv = ["export", "--db", fresh_sqlite_url, "--signing-key", str(key), "-o", str(whole)]
        assert main(argv) == 2  # `callproof export` says the same, as bad input
        assert capsys.readouterr().err.endswith("export a shorter range of receipts\n")
        assert not whole.exists()
        halves: list[dict[str, Any]] = [{"until": middle}, {"since": middle}]
        for n, half in enumerate(halves):
            led.export("acme", tmp_path / f"half-{n}.tar.gz", **half)
    for n, first_seq in enumerate((1, 2201)):
        report = verify_bundle(
            tmp_path / f"half-{n}.tar.gz", signer.public_key_pem(), allow_range=True
        )
        assert report.ok and (report.first_seq, report.checked) == (first_seq, 2200), report
