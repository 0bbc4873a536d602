"""Verification holds a bounded number of schemas: whoever writes receipts chooses how many
distinct tool sets a chain binds (1,250 receipts of distinct 60 KB tool sets took the server's
verify from 119 MB to 929 MB and the offline verifier to 947 MB)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger_kit import WEATHER_PARAMS, draft, ledger, migrated, tool_union

from receipts.binding import SCHEMA_MEMO, SchemaBinding
from receipts.bundle_verify import verify_bundle
from receipts.chain import VerificationReport
from receipts.manifest import schema_hash
from receipts.signing import Signer

DISTINCT = SCHEMA_MEMO + 24


def _union(n: int) -> dict[str, Any]:
    """Tool set ``n``: the weather tool with 60 optional properties of its own (~3 KB)."""
    extra = {f"p{n}_{k}": {"type": "string", "description": "x" * 20} for k in range(60)}
    params = {**WEATHER_PARAMS, "properties": {**WEATHER_PARAMS["properties"], **extra}}
    return tool_union(get_weather=params)


UNIONS = [_union(n) for n in range(DISTINCT)]


def _peak(run: Callable[[], VerificationReport]) -> tuple[VerificationReport, int]:
    """What ``run`` returns and the most bytes Python held meanwhile."""
    tracemalloc.start()
    try:
        report = run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return report, peak


def test_a_binding_remembers_at_most_schema_memo_schemas_and_still_judges_each() -> None:
    binding = SchemaBinding({schema_hash(u): u for u in UNIONS})
    valid = {"valid": True, "errors": []}

    def problem(union: dict[str, Any], arguments: dict[str, Any]) -> str | None:
        calls = [{"id": "call_" + "0" * 24, "name": "get_weather", "arguments": arguments}]
        manifest = {"schema_hash": schema_hash(union)}
        return binding.problem(manifest, {"tool_calls": calls}, valid)

    for union in UNIONS:
        assert problem(union, {"city": "Paris"}) is None
    assert len(binding._schemas) == SCHEMA_MEMO
    # the first was forgotten: it is looked up and compiled again, and judges as before
    assert problem(UNIONS[0], {"city": "Paris", "p0_1": "y"}) is None
    assert "do not validate" in (problem(UNIONS[0], {"city": 5}) or "")
    assert "do not validate" in (problem(UNIONS[0], {"city": "Paris", "p1_1": "y"}) or "")
    assert len(binding._schemas) == SCHEMA_MEMO


def test_verifying_a_chain_of_more_distinct_schemas_than_the_memo(
    db_url: str, tmp_path: Path
) -> None:
    """The stored chain and its bundle verify with Python's memory bounded (the parsed
    schemas were all kept: 9 to 11 MB here, under 4 MB bounded), and a receipt whose schema
    was forgotten and read again is still judged: valid arguments pass, invalid ones fail at
    their seq."""
    migrated(db_url)
    signer = Signer.generate()
    with ledger(db_url, signer, checkpoint_every=10_000) as led:
        for union in UNIONS:
            led.append(draft(schema=union))
        led.append(draft(schema=UNIONS[0]))  # its schema long forgotten
        report, peak = _peak(lambda: led.verify("acme"))
        assert report.ok and report.checked == DISTINCT + 1, report
        assert peak < 6 << 20, peak
        bundle = tmp_path / "ok.tar.gz"
        led.export("acme", bundle)
        report, peak = _peak(lambda: verify_bundle(bundle, signer.public_key_pem()))
        assert report.ok and report.checked == DISTINCT + 1, report
        assert peak < 6 << 20, peak

        bad = led.append(draft(schema=UNIONS[0], arguments={"city": 5}))
        report = led.verify("acme")
        assert not report.ok and report.first_failure_seq == bad.seq, report
        assert "do not validate" in (report.reason or "")
        led.export("acme", tmp_path / "bad.tar.gz")
        report = verify_bundle(tmp_path / "bad.tar.gz", signer.public_key_pem())
        assert not report.ok and report.first_failure_seq == bad.seq, report
