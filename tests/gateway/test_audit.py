"""The audit API: tenant-scoped reads, proofs, verification, replay and the offline bundle."""

from __future__ import annotations

import json
import logging
import secrets
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from conftest import error_of, gateway_settings

from gateway.app import create_app
from migrations.runner import upgrade
from receipts import queries
from receipts.canonical import hash_json
from receipts.checkpoint import checkpoint_problem, make_checkpoint
from receipts.ledger import Ledger
from receipts.merkle import MerkleTree, leaf_hash, verify_consistency, verify_inclusion
from receipts.record import ReceiptDraft
from receipts.signing import KeyRing
from runtime.call_ids import new_call_id

pytestmark = pytest.mark.model

TOOL = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Set an alarm",
        "parameters": {
            "type": "object",
            "properties": {"hour": {"type": "integer", "enum": [6, 7, 8]}},
            "required": ["hour"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def audited(gateway: Any) -> dict[str, Any]:
    """A greedy tool call and a later call of the same tenant, receipted by the gateway."""
    client = gateway.openai()
    first = client.chat.completions.create(
        model=gateway.model,
        temperature=0,
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "Wake me at 7."}],
    )
    second = client.chat.completions.create(
        model=gateway.model,
        temperature=0,
        max_tokens=6,
        extra_body={"regex": "(ok|no)"},
        messages=[{"role": "user", "content": "Reply ok."}],
    )
    return {
        "receipt": first.model_extra["receipt"],
        "call": first.choices[0].message.tool_calls[0],
        "later": second.model_extra["receipt"],
    }


def get_json(gateway: Any, path: str, role: str = "auditor", **params: Any) -> Any:
    with gateway.http(role) as client:
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def listed_ids(gateway: Any, role: str = "auditor", **filters: Any) -> list[str]:
    return [
        r["id"] for r in get_json(gateway, "/audit/receipts", role, limit=500, **filters)["items"]
    ]


def all_receipts(gateway: Any, role: str = "auditor") -> list[dict[str, Any]]:
    items, cursor = [], None
    while True:
        page = get_json(
            gateway, "/audit/receipts", role, limit=500, **({"cursor": cursor} if cursor else {})
        )
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def download_export(gateway: Any, role: str, path: Path) -> list[dict[str, Any]]:
    """The tenant's bundle written to ``path``; returns its receipts."""
    with gateway.http(role) as client, client.stream("GET", "/audit/export") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/gzip")
        with path.open("wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
    with tarfile.open(path) as tar:
        lines = tar.extractfile("receipts.jsonl").read().splitlines()  # type: ignore[union-attr]
    return [json.loads(line) for line in lines]


def test_list_filter_and_paginate(gateway: Any, audited: dict[str, Any]) -> None:
    rid = audited["receipt"]["id"]
    by_tool = get_json(gateway, "/audit/receipts", tool_name="set_alarm")
    assert rid in [r["id"] for r in by_tool["items"]]
    assert all(
        any(c["name"] == "set_alarm" for c in r["output"]["tool_calls"]) for r in by_tool["items"]
    )
    assert audited["later"]["id"] not in [r["id"] for r in by_tool["items"]]
    by_call = get_json(gateway, "/audit/receipts", call_id=audited["call"].id)
    assert [r["id"] for r in by_call["items"]] == [rid]
    assert rid in listed_ids(gateway, model=gateway.model)
    assert listed_ids(gateway, model="not-" + gateway.model) == []
    schema_hash = get_json(gateway, f"/audit/receipts/{rid}")["manifest"]["schema_hash"]
    by_schema = get_json(gateway, "/audit/receipts", schema_hash=schema_hash, limit=500)["items"]
    assert rid in [r["id"] for r in by_schema]
    assert {r["manifest"]["schema_hash"] for r in by_schema} == {schema_hash}
    assert audited["later"]["id"] not in [r["id"] for r in by_schema]  # a regex: no schema
    seqs, cursor = [], None
    while True:
        page = get_json(
            gateway, "/audit/receipts", limit=2, **({"cursor": cursor} if cursor else {})
        )
        seqs += [r["seq"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 2


def test_time_windows_are_rfc3339_with_an_offset_and_in_order(
    gateway: Any, audited: dict[str, Any]
) -> None:
    first, later = audited["receipt"]["id"], audited["later"]["id"]
    created = get_json(gateway, f"/audit/receipts/{first}")["created_at"]
    created_later = get_json(gateway, f"/audit/receipts/{later}")["created_at"]
    assert created < created_later
    listed = listed_ids(gateway, since=created, until="2999-01-01T00:00:00+00:00")
    assert first in listed and later in listed
    assert first not in listed_ids(gateway, since=created_later)  # since is included...
    assert later in listed_ids(gateway, since=created_later)
    before_later = listed_ids(gateway, until=created_later)  # ...and until excluded
    assert first in before_later and later not in before_later
    just_after = created_later[:-1] + "0001Z"  # finer than the receipts' microseconds
    assert later in listed_ids(gateway, until=just_after)
    assert later not in listed_ids(gateway, since=just_after)
    assert first in listed_ids(gateway, since="0999-01-01T00:00:00Z")  # a year before 1000
    lower = listed_ids(gateway, since=created.lower(), until=created_later.lower())
    assert first in lower and later not in lower  # RFC 3339 section 5.6 allows "t" and "z"
    assert listed_ids(gateway, until="0999-01-01T00:00:00Z") == []  # sorts as a time
    with gateway.http("auditor") as client:
        for path in ("/audit/receipts", "/audit/export"):
            for guessed in (
                "2026-11-22T16:29:20",
                "1795365000",
                "2026-11-22 16:29:20Z",
                "2026-13-01T00:00:00Z",
                "2026-11-22T16:29:20-73:76",
                "2026-11-22T16:29:20+05:99",  # read by Python as +06:39
                "2026-11-22T16:29:20+24:00",
            ):
                error = error_of(client.get(path, params={"since": guessed}), 400)
                assert error["param"] == "since", (path, guessed, error)
                words = ("RFC 3339 time with its offset", "not a valid time")
                assert any(w in error["message"] for w in words), error  # not a regex
            backwards = {"since": "2026-11-22T17:00:00Z", "until": "2026-11-22T16:00:00Z"}
            response = client.get(path, params=backwards)
            assert response.status_code == 400, response.text
            assert "since must not be after until" in response.json()["error"]["message"]


def test_a_receipt_names_the_key_and_the_request_that_asked(gateway: Any) -> None:
    """Who made a tool call: the agent's API key id (never its secret) and the request id
    that the response's x-request-id and the gateway's log lines carry, both signed."""
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model=gateway.model,
        max_tokens=4,
        extra_body={"regex": "(ok|no)"},
        messages=[{"role": "user", "content": "Reply ok."}],
    )
    receipt_id = raw.parse().model_extra["receipt"]["id"]
    request = get_json(gateway, f"/audit/receipts/{receipt_id}")["request"]
    agent = gateway.keys.lookup(gateway.secrets["agent"])
    assert request["api_key_id"] == agent.id
    assert request["request_id"] == raw.headers["x-request-id"]
    assert gateway.secrets["agent"] not in json.dumps(request)
    with gateway.openai().chat.completions.with_streaming_response.create(
        model=gateway.model,
        max_tokens=4,
        stream=True,
        extra_body={"regex": "(ok|no)"},
        messages=[{"role": "user", "content": "Reply ok."}],
    ) as streamed:
        chunks = list(streamed.parse())
        header = streamed.headers["x-request-id"]
    receipt_id = chunks[-1].model_extra["receipt"]["id"]
    request = get_json(gateway, f"/audit/receipts/{receipt_id}")["request"]
    assert (request["api_key_id"], request["request_id"]) == (agent.id, header)


def test_receipt_call_and_schema(gateway: Any, audited: dict[str, Any]) -> None:
    receipt = get_json(gateway, f"/audit/receipts/{audited['receipt']['id']}")
    assert receipt["entry_hash"] == audited["receipt"]["entry_hash"]
    assert receipt["tenant"] == gateway.tenant
    call = get_json(gateway, f"/audit/calls/{audited['call'].id}")
    assert call["receipt"]["id"] == receipt["id"]
    schema = get_json(gateway, f"/audit/schemas/{receipt['manifest']['schema_hash']}")
    assert hash_json(schema) == receipt["manifest"]["schema_hash"]


def test_a_calls_answers_and_a_listing_are_bounded_and_page_on(
    gateway: Any, audited: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent can answer a call without end and make each receipt large: /audit/calls
    holds the first answers and names the cursor of the `answering` listing for the rest,
    and a listing page ends at its byte budget with a cursor that goes on (the bounds are
    lowered here from 100 answers and 4 MiB)."""
    rid, call_id = audited["receipt"]["id"], audited["call"].id
    link = [{"tool_call_id": call_id, "receipt_id": rid}]
    answers = [_recorded_elsewhere(gateway, rid, links=link) for _ in range(3)]
    monkeypatch.setattr(queries, "ANSWERS", 2)
    call = get_json(gateway, f"/audit/calls/{call_id}")
    assert [r["id"] for r in call["answered_by"]] == answers[:2]
    cursor = call["answered_by_next_cursor"]
    assert cursor == call["answered_by"][-1]["seq"]
    rest = get_json(gateway, "/audit/receipts", answering=call_id, cursor=cursor)
    assert ([r["id"] for r in rest["items"]], rest["next_cursor"]) == (answers[2:], None)
    monkeypatch.setattr(queries, "PAGE_BYTES", 1)  # every receipt passes it: one per page
    first = get_json(gateway, "/audit/receipts", answering=call_id, limit=10)
    assert [r["id"] for r in first["items"]] == answers[:1]
    assert first["next_cursor"] == first["items"][0]["seq"]


def test_keys_checkpoint_and_proofs(gateway: Any, audited: dict[str, Any]) -> None:
    keys = get_json(gateway, "/audit/keys")
    ring = KeyRing.from_public_keys(keys)
    assert gateway.signer.key_id in ring
    with gateway.http("auditor") as client:
        checkpoint = client.post("/audit/checkpoints").json()
    assert checkpoint == get_json(gateway, "/audit/checkpoints/latest")
    assert checkpoint_problem(checkpoint, ring) is None
    size = checkpoint["tree_size"]
    seq = audited["receipt"]["seq"]
    # The roots, recomputed from the receipts the auditor lists, not taken from the server.
    entries = [r["entry_hash"] for r in all_receipts(gateway)]
    assert MerkleTree.from_entry_hashes(entries[:size]).root().hex() == checkpoint["root_hash"]
    inclusion = get_json(gateway, f"/audit/proofs/inclusion/{seq}", tree_size=size)
    verify_inclusion(  # raises ProofError unless the proof leads to the signed root
        leaf_hash(bytes.fromhex(audited["receipt"]["entry_hash"])),
        seq - 1,
        size,
        [bytes.fromhex(h) for h in inclusion["proof"]],
        bytes.fromhex(checkpoint["root_hash"]),
    )
    consistency = get_json(gateway, "/audit/proofs/consistency", first=seq, second=size)
    root1 = MerkleTree.from_entry_hashes(entries[:seq]).root()
    assert consistency["root1"] == root1.hex()
    verify_consistency(
        seq,
        size,
        [bytes.fromhex(h) for h in consistency["proof"]],
        root1,
        bytes.fromhex(checkpoint["root_hash"]),
    )
    with gateway.http("auditor") as client:
        bad = client.get("/audit/proofs/consistency", params={"first": size + 5, "second": size})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_value"


def test_verify_a_range(gateway: Any, audited: dict[str, Any]) -> None:
    with gateway.http("auditor") as client:
        report = client.post("/audit/verify", json={"from_seq": 1}).json()
        unsafe = client.post("/audit/verify", json={"to_seq": 2**53})  # not exact in JSON
        inexact = client.get(f"/audit/proofs/inclusion/{2**53}")
    assert report["ok"] is True and report["checked"] >= 2, report
    assert unsafe.status_code == 400 and inexact.status_code == 400, (unsafe.text, inexact.text)


def test_verify_against_a_checkpoint_the_auditor_kept(
    gateway: Any, audited: dict[str, Any]
) -> None:
    with gateway.http("auditor") as client:
        kept = client.post("/audit/checkpoints").json()
        report = client.post("/audit/verify", json={"checkpoint": kept}).json()
        assert report["ok"] is True, report
        forged = {**kept, "root_hash": "0" * 64}
        report = client.post("/audit/verify", json={"checkpoint": forged}).json()
    assert report["ok"] is False and "saved checkpoint" in report["reason"], report


def test_verify_a_range_against_a_checkpoint_the_auditor_kept(
    gateway: Any, audited: dict[str, Any]
) -> None:
    """A range that ends before the kept checkpoint's size read as "truncated since it was
    saved", one that starts after it failed too, and another tenant's checkpoint was "signed
    by a retired key": the gateway holds the whole tree, so each range is checked against
    the kept root, and the wrong chain is named."""
    client = gateway.openai()
    with gateway.http("auditor") as auditor:
        kept = auditor.post("/audit/checkpoints").json()
        for _ in range(2):  # the chain grows past the kept size
            client.chat.completions.create(
                model=gateway.model,
                temperature=0,
                max_tokens=6,
                extra_body={"regex": "(ok|no)"},
                messages=[{"role": "user", "content": "Reply ok."}],
            )
        reports = [
            auditor.post("/audit/verify", json={**span, "checkpoint": kept}).json()
            for span in ({"to_seq": 1}, {"from_seq": kept["tree_size"] + 2})
        ]
        theirs = make_checkpoint("globex", 1, kept["root_hash"], gateway.signer)
        foreign = auditor.post("/audit/verify", json={"checkpoint": theirs}).json()
    for report in reports:
        assert report["ok"] is True, report
        assert any("outside seq" in note for note in report["notes"]), report
    assert foreign["ok"] is False and "for chain 'globex', not 'acme'" in foreign["reason"]


def test_replay_of_a_greedy_receipt_matches(
    gateway: Any, audited: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """It matches, and leaves its trail in the log: nothing is receipted for a replay."""
    receipt_id = audited["receipt"]["id"]
    with caplog.at_level(logging.INFO, "callproof.gateway"), gateway.http("auditor") as client:
        response = client.post(f"/audit/replay/{receipt_id}", json={})
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["match"] is True, report["diff"]
    assert report["replayed"]["tool_calls"] == report["recorded"]["tool_calls"]
    auditors = [k.id for k in gateway.keys.list() if (k.role, k.tenant) == ("auditor", "acme")]
    trail = [r for r in caplog.records if getattr(r, "event", None) == "receipt_replayed"]
    assert [(r.receipt_id, r.match, r.forced) for r in trail] == [(receipt_id, True, False)]
    assert trail[0].api_key_id in auditors, (trail[0].api_key_id, auditors)


def test_replay_of_a_long_prompt_matches_once_the_engine_has_seen_it(gateway: Any) -> None:
    """A prompt new to the engine, then again and replayed: vLLM's prefix cache (on by
    default) computed a cached prompt's logits apart from a new one's, and the replay of a
    greedy receipt differed; the engine now computes each prompt alike (docs/deploy.md)."""
    prompt = secrets.token_hex(6) + " " + "word " * 1990  # new to the cache; 2,000 tokens
    client = gateway.openai()
    answers = [
        client.chat.completions.create(
            model=gateway.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=20,
            seed=7,
        )
        for _ in range(2)
    ]
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    with gateway.http("auditor") as auditor:
        response = auditor.post(f"/audit/replay/{answers[0].model_extra['receipt']['id']}", json={})
    assert response.status_code == 200, response.text
    assert response.json()["match"] is True, response.json()["diff"]


def test_exported_bundle_verifies_offline(
    gateway: Any, audited: dict[str, Any], tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle.tar.gz"
    exported = download_export(gateway, "auditor", bundle)
    assert [r["id"] for r in exported] == [r["id"] for r in all_receipts(gateway)]
    assert audited["receipt"]["id"] in [r["id"] for r in exported]
    pem = tmp_path / "key.pem"
    pem.write_text(gateway.signer.public_key_pem())
    verified = subprocess.run(
        [sys.executable, "-m", "callproof", "verify", str(bundle), "--public-key", str(pem)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_other_tenants_and_other_roles_see_nothing(
    gateway: Any, audited: dict[str, Any], tmp_path: Path
) -> None:
    """Both tenants hold receipts; each auditor sees its own chain and nothing of the other."""
    from openai import OpenAI

    theirs = OpenAI(
        base_url=gateway.url + "/v1", api_key=gateway.secrets["other_agent"], max_retries=0
    ).chat.completions.create(
        model=gateway.model,
        max_tokens=4,
        extra_body={"regex": "(ok|no)"},
        messages=[{"role": "user", "content": "Reply ok."}],
    )
    their_id = theirs.model_extra["receipt"]["id"]
    rid, call_id = audited["receipt"]["id"], audited["call"].id
    ours = {r["id"] for r in all_receipts(gateway)}
    their_chain = all_receipts(gateway, "other_auditor")
    assert their_id in {r["id"] for r in their_chain} and their_id not in ours
    assert {r["tenant"] for r in their_chain} == {"globex"}
    assert [r["id"] for r in download_export(gateway, "other_auditor", tmp_path / "b")] == [
        r["id"] for r in their_chain
    ]
    # The shared signing key's created_at is when it first signed each tenant's own chain:
    # not its registration, which told globex when acme's first receipt was made.
    for role, chain in (("other_auditor", their_chain), ("auditor", all_receipts(gateway))):
        (key,) = get_json(gateway, "/audit/keys", role)
        assert key["created_at"] == chain[0]["created_at"], role
    with gateway.http("other_auditor") as other:
        checkpoint = other.post("/audit/checkpoints").json()
        assert (checkpoint["chain"], checkpoint["tree_size"]) == ("globex", len(their_chain))
        assert other.get(f"/audit/receipts/{rid}").status_code == 404
        assert other.get(f"/audit/calls/{call_id}").status_code == 404
        assert other.post(f"/audit/replay/{rid}", json={}).status_code == 404
        report = other.post("/audit/verify", json={}).json()
        assert (report["chain"], report["checked"]) == ("globex", len(their_chain)), report
    with gateway.http("auditor") as auditor:
        assert auditor.get(f"/audit/receipts/{their_id}").status_code == 404
        assert auditor.post(f"/audit/replay/{their_id}", json={}).status_code == 404
    with gateway.http("agent") as agent:
        for path in (f"/audit/receipts/{rid}", "/audit/receipts", "/audit/export"):
            response = agent.get(path)
            assert response.status_code == 403, path
            assert response.json()["error"]["code"] == "wrong_role"


def test_a_page_limit_past_1000_is_refused_naming_limit(gateway: Any) -> None:
    """The route's own bound (the ledger's 1,000 a page), so the 400 names the parameter and
    the OpenAPI schema documents the maximum."""
    with gateway.http("auditor") as client:
        error = error_of(client.get("/audit/receipts", params={"limit": 1001}), 400)
        assert error["param"] == "limit"
        document = client.get("/schema/openapi.json").json()
    parameters = document["paths"]["/audit/receipts"]["get"]["parameters"]
    (limit,) = [p for p in parameters if p["name"] == "limit"]
    assert limit["schema"]["maximum"] == queries.MAX_PAGE == 1000


def test_a_schema_only_another_tenants_chain_binds_is_not_found(
    gateway: Any, audited: dict[str, Any]
) -> None:
    """Schemas are stored once for all tenants; an auditor sees one only when a receipt of
    its own chain binds it."""
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    theirs = {**gateway.ledger.schema(original.manifest["schema_hash"]), "$comment": "globex"}
    bound = hash_json(theirs)
    manifest = {**original.manifest, "schema_hash": bound}
    _recorded_elsewhere(gateway, original.id, tenant="globex", schema=theirs, manifest=manifest)
    with gateway.http("other_auditor") as other:
        assert other.get(f"/audit/schemas/{bound}").json() == theirs
    with gateway.http("auditor") as auditor:
        assert error_of(auditor.get(f"/audit/schemas/{bound}"), 404)["code"] == "not_found"


def test_a_window_or_range_at_the_chains_edge(gateway: Any, audited: dict[str, Any]) -> None:
    """since == until is an empty window, not a reversed one; a verify range past the head
    is a 400 naming the bound, on an empty chain too, where an empty body verifies trivially
    unless a saved checkpoint says the chain held receipts."""
    moment = "2024-01-01T00:00:00Z"
    with gateway.http("auditor") as auditor:
        window = auditor.get("/audit/receipts", params={"since": moment, "until": moment})
        assert window.status_code == 200 and window.json()["items"] == [], window.text
        head = audited["receipt"]["seq"] + len(all_receipts(gateway))  # past it, surely
        error = error_of(auditor.post("/audit/verify", json={"to_seq": head}), 400)
        assert error["param"] == "to_seq" and "beyond this chain's head" in error["message"]
    tenant = "never-used"
    with gateway.auditor_of(tenant) as empty:
        report = empty.post("/audit/verify", json={}).json()
        assert report["ok"] and report["checked"] == 0, report
        error = error_of(empty.post("/audit/verify", json={"from_seq": 1}), 400)
        assert (
            error["param"] == "from_seq" and "beyond this chain's head (seq 0)" in error["message"]
        )
        held = make_checkpoint(tenant, 3, "ab" * 32, gateway.signer)
        report = empty.post("/audit/verify", json={"checkpoint": held}).json()
        assert not report["ok"] and "truncated" in report["reason"], report
        # no receipt of this chain lists the key: the signature is named as unchecked
        assert "so its signature is unchecked" in report["reason"], report


def _recorded_elsewhere(gateway: Any, receipt_id: str, **changes: Any) -> str:
    """Append a copy of a receipt as another replica would record it (fresh call ids; the
    manifest or request changed as given) and return the new receipt's id."""
    original = gateway.ledger.get(gateway.tenant, receipt_id)
    fields = {
        "tenant": original.tenant,
        "manifest": original.manifest,
        "schema": gateway.ledger.schema(original.manifest["schema_hash"]),
        "request": original.request,
        "output": {
            **original.output,
            "tool_calls": [{**c, "id": new_call_id()} for c in original.tool_calls],
        },
        "finish_reason": original.finish_reason,
        "usage": original.usage,
        "validation": original.validation,
        "fallback": original.fallback,
        "links": [],
    }
    fields.update(changes)
    return gateway.ledger.append(ReceiptDraft(**fields)).id


def test_replay_on_a_different_engine_is_refused_unless_forced(
    gateway: Any, audited: dict[str, Any]
) -> None:
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    changed = {
        "model": "another-model",
        "weights_digest": "0" * 64,
        "tokenizer_digest": "1" * 64,
        "engine": "vllm" if original.manifest["engine"] != "vllm" else "embedded",
        "renderer": "llama" if original.manifest["renderer"] != "llama" else "qwen",
        "backend": "a-retired-backend",
    }
    foreign = _recorded_elsewhere(gateway, original.id, manifest={**original.manifest, **changed})
    with gateway.http("auditor") as client:
        refused = client.post(f"/audit/replay/{foreign}", json={})
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "manifest_mismatch"
        named = [difference.split(":")[0] for difference in error["differences"]]
        assert named == list(changed), error
        forced = client.post(f"/audit/replay/{foreign}", json={"force": True}).json()
    assert forced["forced"] is True and forced["differences"] == error["differences"]
    assert forced["match"] is True, forced["diff"]


def test_replay_reports_recorded_arguments_the_engine_does_not_produce(
    gateway: Any, audited: dict[str, Any]
) -> None:
    """A receipt whose recorded call differs from what the same request decodes to: the
    replay says so, naming the tool calls recorded and replayed."""
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    call = original.tool_calls[0]
    other_hour = 6 if call["arguments"]["hour"] != 6 else 8
    output = {
        **original.output,
        "tool_calls": [{**call, "id": new_call_id(), "arguments": {"hour": other_hour}}],
    }
    edited = _recorded_elsewhere(gateway, original.id, output=output)
    with gateway.http("auditor") as client:
        response = client.post(f"/audit/replay/{edited}", json={})
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["match"] is False and report["differences"] == []
    assert report["recorded"]["tool_calls"] == [
        {"name": "set_alarm", "arguments": {"hour": other_hour}}
    ]
    assert report["replayed"]["tool_calls"] == [
        {"name": "set_alarm", "arguments": call["arguments"]}
    ]
    assert [line.split(":")[0] for line in report["diff"]] == ["tool_calls"]


def test_replay_needs_the_retained_payload(gateway: Any, audited: dict[str, Any]) -> None:
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    digests_only = {k: v for k, v in original.request.items() if k != "payload_json"}
    receipt_id = _recorded_elsewhere(gateway, original.id, request=digests_only)
    with gateway.http("auditor") as client:
        refused = client.post(f"/audit/replay/{receipt_id}", json={})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "payload_not_retained"


def _recorded_with_params(gateway: Any, audited: dict[str, Any], **params: Any) -> str:
    """A copy of the audited receipt whose retained request has ``params`` changed (its
    digest recomputed, so the receipt verifies): what an older release, or a laxer limit,
    recorded."""
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    payload = original.request["payload_json"]
    changed = {**json.loads(payload["params"]), **params}
    request = {
        **original.request,
        "params_sha256": hash_json(changed),
        "payload_json": {**payload, "params": json.dumps(changed)},
    }
    return _recorded_elsewhere(gateway, original.id, request=request)


def test_replay_of_a_request_this_gateway_no_longer_accepts_is_a_409(
    gateway: Any, audited: dict[str, Any]
) -> None:
    """A request recorded by a release that read requests more loosely (here a named
    tool_choice without its "type", which OpenAI requires) is refused as such, not a 500."""
    receipt_id = _recorded_with_params(gateway, audited, tool_choice={"function": {"name": "x"}})
    with gateway.http("auditor") as client:
        error = error_of(client.post(f"/audit/replay/{receipt_id}", json={}), 409)
    assert error["code"] == "request_not_replayable"
    assert "tool_choice" in error["message"], error


def test_replay_of_a_request_past_a_limit_lowered_since_is_a_409(
    gateway: Any, audited: dict[str, Any]
) -> None:
    """A request recorded with more tools than max_tools allows now (the limit lowered after
    it was recorded) was a 400 `constraint_too_complex` to an auditor who sent `{}`."""
    tool = TOOL["function"]
    tools = [
        {"type": "function", "function": {**tool, "name": f"{tool['name']}_{i}"}}
        for i in range(gateway.settings.max_tools + 1)
    ]
    receipt_id = _recorded_with_params(gateway, audited, tools=tools, tool_choice="auto")
    with gateway.http("auditor") as client:
        error = error_of(client.post(f"/audit/replay/{receipt_id}", json={}), 409)
    assert error["code"] == "request_not_replayable", error
    assert f"max_tools is {gateway.settings.max_tools}" in error["message"], error


def test_the_receipt_digests_the_request_exactly_as_sent(gateway: Any) -> None:
    """What an auditor holding the agent's transcript can recompute: members the gateway does
    not read (the SDK's `parsed`), explicit nulls and the client's member order included."""
    sent = {
        "model": gateway.model,
        "messages": [
            {"role": "user", "content": "Wake me at 7."},
            {"content": None, "refusal": None, "role": "assistant", "parsed": None},
            {"role": "user", "content": "Please."},
        ],
        "tools": [TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 64,
        "user": None,
    }
    with gateway.http("agent") as client:
        response = client.post("/v1/chat/completions", json=sent)
    assert response.status_code == 200, response.text
    request = gateway.ledger.get(gateway.tenant, response.json()["receipt"]["id"]).request
    params = {k: v for k, v in sent.items() if k != "messages"}
    assert request["messages_sha256"] == hash_json(sent["messages"])
    assert request["params_sha256"] == hash_json(params)
    assert json.loads(request["payload_json"]["params"]) == params
    assert list(json.loads(request["payload_json"]["params"])) == list(params)  # client's order


def test_replay_sends_the_schema_in_the_clients_property_order(gateway: Any) -> None:
    """Property order is part of the prompt and of the grammar: "zone" is decoded first."""
    schema = {
        "type": "object",
        "properties": {"zone": {"enum": ["north", "south"]}, "hour": {"enum": [6, 7, 8]}},
        "required": ["zone", "hour"],
        "additionalProperties": False,
    }
    completion = gateway.openai().chat.completions.create(
        model=gateway.model,
        temperature=0,
        messages=[{"role": "user", "content": "Wake me at 7 in the north."}],
        response_format={"type": "json_schema", "json_schema": {"name": "alarm", "schema": schema}},
    )
    assert completion.choices[0].message.content.startswith('{"zone"')
    with gateway.http("auditor") as client:
        report = client.post(f"/audit/replay/{completion.model_extra['receipt']['id']}", json={})
    assert report.status_code == 200, report.text
    assert report.json()["match"] is True, report.json()["diff"]
    # the receipt binds the text's hash; the report gives the replayed text to compare
    assert report.json()["replayed"]["content"] == completion.choices[0].message.content


def test_a_replay_without_valid_output_is_a_mismatch_not_an_error(
    gateway: Any, audited: dict[str, Any]
) -> None:
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    sampling = {**original.manifest["sampling"], "max_tokens": 2}
    cut = _recorded_elsewhere(
        gateway, original.id, manifest={**original.manifest, "sampling": sampling}
    )
    with gateway.http("auditor") as client:
        response = client.post(f"/audit/replay/{cut}", json={})
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["match"] is False and "max_tokens=2 ran out" in report["replayed"]["error"]
    assert report["diff"][0].startswith("output: recorded a 'tool_calls' output")


@pytest.mark.parametrize(
    ("path", "query", "param"),
    [
        ("/audit/receipts", "tool=set_alarm", "tool"),  # tool_name mistyped
        ("/audit/receipts", "tool_name=a&tool_name=b", "tool_name"),
        ("/audit/export", "from=3", "from"),
        ("/audit/keys", "tenant=globex", "tenant"),
    ],
)
def test_a_query_parameter_the_route_does_not_take_or_given_twice_is_400(
    gateway: Any, path: str, query: str, param: str
) -> None:
    """Not silently dropped: a mistyped filter would read as "everything matched"."""
    with gateway.http("auditor") as client:
        response = client.get(f"{path}?{query}")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    with gateway.http("auditor") as client:
        assert client.get("/audit/receipts?tool_name=set_alarm&limit=5").status_code == 200


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/audit/proofs/inclusion/1_0", "seq"),  # int() reads 10
        ("/audit/proofs/inclusion/%D9%A1", "seq"),  # an Arabic-Indic one
        ("/audit/proofs/inclusion/1?tree_size=+1", "tree_size"),
        ("/audit/receipts?limit=1e1", "limit"),  # read as 10
        ("/audit/proofs/consistency?first=1&second=%201", "second"),
    ],
)
def test_an_integer_has_one_spelling(
    gateway: Any, audited: dict[str, Any], path: str, param: str
) -> None:
    with gateway.http("auditor") as client:
        response = client.get(path)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
        assert client.get("/audit/proofs/inclusion/1?tree_size=1").status_code == 200


def test_admin_routes_refuse_unknown_query_parameters_too(gateway: Any) -> None:
    with gateway.http("admin") as client:
        response = client.get("/admin/keys?role=agent")
    assert response.status_code == 400 and response.json()["error"]["param"] == "role"


def test_the_query_check_comes_after_authentication(gateway: Any) -> None:
    """Who is not authenticated learns nothing about a route's parameters."""
    with gateway.http(None) as client:
        response = client.get("/audit/receipts?tool=x")
    assert response.status_code == 401


def test_replay_takes_a_receipt_a_fallback_backend_enforced(
    gateway: Any, audited: dict[str, Any]
) -> None:
    """The embedded engine tries its backends in order; the one that compiled is recorded,
    and a receipt of its last fallback replays on that backend, not on the first that
    compiles (which ran it before: greedy decoding under another grammar backend may pick
    other tokens, and an unforced replay mismatched with nothing to blame). An engine with one
    backend (vLLM: the one its server was started with) refuses a receipt of another as a
    manifest mismatch."""
    backends = gateway.engine.identity.backends
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    other = backends[-1] if len(backends) > 1 else "a-backend-it-lacks"
    fallback = _recorded_elsewhere(
        gateway, original.id, manifest={**original.manifest, "backend": other}
    )
    with gateway.http("auditor") as client:
        response = client.post(f"/audit/replay/{fallback}", json={})
    if len(backends) > 1:  # its output was the first backend's: only the backend is checked
        assert response.status_code == 200, response.text
        report = response.json()
        assert report["differences"] == [] and report["replayed"]["backend"] == other, report
    else:
        error = error_of(response, 409)
        assert error["code"] == "manifest_mismatch"
        assert [d.split(":")[0] for d in error["differences"]] == ["backend"], error


@contextmanager
def _tampered_copy(
    gateway: Any, audited: dict[str, Any], server_loop: Any, tmp_path: Path, tamper: str
) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """Three copies of the audited receipt in a chain of their own (a SQLite file), then
    ``tamper`` run on it as an attacker would (append-only triggers off), served by a second
    app: its URL, the copies' ids and an auditor's headers."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    names = ("tenant", "manifest", "request", "output", "finish_reason", "usage", "validation")
    copy = {name: getattr(original, name) for name in names}
    schema = gateway.ledger.schema(original.manifest["schema_hash"])
    with Ledger(url, gateway.signer, retain_payloads=True) as ledger:
        ids = []
        for _ in range(3):
            calls = [{**c, "id": new_call_id()} for c in original.tool_calls]
            output = {**original.output, "tool_calls": calls}
            draft = ReceiptDraft(**{**copy, "output": output}, schema=schema, links=[])
            ids.append(ledger.append(draft).id)
        with sa.create_engine(url).begin() as conn:
            triggers = conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type='trigger'"))
            for name in triggers.scalars().all():
                conn.execute(sa.text(f'DROP TRIGGER "{name}"'))
            conn.exec_driver_sql(tamper)
        app = create_app(gateway_settings(tmp_path, url), gateway.engine, ledger, gateway.keys)
        base, stop = server_loop.serve(app)
        try:
            yield base, ids, {"Authorization": f"Bearer {gateway.secrets['auditor']}"}
        finally:
            stop()


def test_verify_reports_a_deleted_receipt_instead_of_refusing_the_range(
    gateway: Any, audited: dict[str, Any], server_loop: Any, tmp_path: Path
) -> None:
    """A range check on which rows exist answered 400 to `from_seq` = the deleted seq."""
    tamper = "DELETE FROM receipts WHERE seq = 2"
    with _tampered_copy(gateway, audited, server_loop, tmp_path, tamper) as (base, _, headers):
        response = httpx.post(
            f"{base}/audit/verify", json={"from_seq": 2}, headers=headers, timeout=60
        )
        export = httpx.get(f"{base}/audit/export", headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["ok"] is False and report["first_failure_seq"] == 2, report
    # An export is all the receipts or an error naming the gap, never a quietly short bundle.
    assert export.status_code == 500, export.headers
    error = export.json()["error"]
    assert error["code"] == "chain_damaged" and "receipt seq 2 is missing" in error["message"]


def test_a_receipt_that_does_not_verify_is_not_replayed(
    gateway: Any, audited: dict[str, Any], server_loop: Any, tmp_path: Path
) -> None:
    """A replay re-runs what the receipt records; one whose body was edited would replay the
    edit and report a match. It is refused naming the receipt and why."""
    tamper = (  # one more digit in front of the completion token count
        "UPDATE receipts SET body = replace(body, '\"completion_tokens\":',"
        " '\"completion_tokens\":1') WHERE seq = 2"
    )
    with _tampered_copy(gateway, audited, server_loop, tmp_path, tamper) as (base, ids, headers):
        response = httpx.post(f"{base}/audit/replay/{ids[1]}", json={}, headers=headers)
        # a replay runs the model: httpx's default 5 s is too short on a loaded machine
        intact = httpx.post(f"{base}/audit/replay/{ids[2]}", json={}, headers=headers, timeout=120)
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "chain_damaged"
    assert f"receipt {ids[1]} (seq 2) does not verify" in error["message"]
    assert intact.status_code == 200, intact.text


def test_a_stored_receipt_that_no_longer_parses_is_named_by_its_seq(
    gateway: Any, audited: dict[str, Any], server_loop: Any, tmp_path: Path
) -> None:
    """The 500 said "a stored receipt is malformed" and no more: every listing page holding
    it failed with nothing to tell the auditor where to look."""
    tamper = 'UPDATE receipts SET body = replace(body, \'"seq":2\', \'"seq":"2"\') WHERE seq = 2'
    with _tampered_copy(gateway, audited, server_loop, tmp_path, tamper) as (base, ids, headers):
        listing = httpx.get(f"{base}/audit/receipts", headers=headers, timeout=60)
        one = httpx.get(f"{base}/audit/receipts/{ids[1]}", headers=headers, timeout=60)
    for response in (listing, one):
        error = error_of(response, 500)
        assert error["code"] == "chain_damaged", error
        assert "the receipt stored at seq 2 is malformed" in error["message"], error


def test_a_tenant_without_receipts_can_pin_the_key_that_will_sign(gateway: Any) -> None:
    secret = gateway.keys.create("auditor", "initech")[1]
    headers = {"Authorization": f"Bearer {secret}"}
    keys = httpx.get(f"{gateway.url}/audit/keys", headers=headers).json()
    assert keys == [
        {
            "key_id": gateway.signer.key_id,
            "public_key_pem": gateway.signer.public_key_pem(),
            "ranges": [],
        }
    ]


def test_an_identifier_with_a_trailing_newline_is_malformed_not_looked_up(
    gateway: Any, audited: dict[str, Any]
) -> None:
    """Python's `$` matches before a final newline: the shape checks must not let one in.
    The 400 says the shape in words, not the pattern that checks it."""
    receipt_id, call_id = audited["receipt"]["id"], audited["call"].id
    rcpt, call = "rcpt_ and 24 lowercase hex digits", "call_ and 24 lowercase hex digits"
    with gateway.http("auditor") as client:
        for path, param, words in (
            (f"/audit/receipts/{receipt_id}%0A", "receipt_id", rcpt),
            (f"/audit/calls/{call_id}%0A", "call_id", call),
            ("/audit/schemas/abc", "schema_hash", "a SHA-256 hash: 64 lowercase hex digits"),
        ):
            error = error_of(client.get(path), 400)
            assert error["param"] == param and f"{param} must be {words}" in error["message"]
        listed = client.get("/audit/receipts", params={"call_id": call_id + "\n"})
        assert f"call_id must be {call}" in error_of(listed, 400)["message"]
        not_a_seq = client.get("/audit/proofs/inclusion/abc")  # a route segment: no such route
        assert (not_a_seq.status_code, not_a_seq.json()["error"]["code"]) == (404, "not_found")
    with gateway.http("admin") as client:
        revoked = client.delete("/admin/keys/key_0123456789abcdef%0A")
        assert (
            "key_id must be key_ and 16 lowercase hex digits" in error_of(revoked, 400)["message"]
        )
        for tenant in ("acme\n", ""):
            created = client.post("/admin/keys", json={"role": "agent", "tenant": tenant})
            error = error_of(created, 400)
            assert error["param"] == "tenant" and "tenant must be 1-128 letters" in error["message"]


def test_whole_chain_audits_in_flight_leave_every_tenant_served(
    gateway: Any, audited: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifications and exports run on threads of their own: eight long ones in flight (a
    big chain) took every thread of the shared pool, and another tenant's key lookup then
    timed out into a 503, as if the database were down."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    verify = gateway.ledger.verify
    running = threading.Semaphore(0)

    def long_verify(*args: Any, **kwargs: Any) -> Any:
        running.release()
        release.wait(60)
        return verify(*args, **kwargs)

    monkeypatch.setattr(gateway.ledger, "verify", long_verify)
    lookup, looked_up = gateway.keys.lookup, set()

    def watched_lookup(secret: str) -> Any:
        looked_up.add(secret)
        return lookup(secret)

    monkeypatch.setattr(gateway.keys, "lookup", watched_lookup)
    newcomer = gateway.keys.create("agent", "another-tenant")[1]  # not cached: looked up
    auditors = []  # eight tenants: one tenant gets one verification at a time
    for n in range(8):
        _recorded_elsewhere(gateway, audited["receipt"]["id"], tenant=f"in-flight-{n}")
        auditors.append(gateway.keys.create("auditor", f"in-flight-{n}")[1])

    def post_verify(secret: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {secret}"}
        return httpx.post(f"{gateway.url}/audit/verify", json={}, headers=headers, timeout=120)

    with ThreadPoolExecutor(8) as pool:
        verifies = [pool.submit(post_verify, secret) for secret in auditors]
        try:
            deadline = time.monotonic() + 30
            while not looked_up.issuperset(auditors):  # all eight arrived and were let in
                assert time.monotonic() < deadline, "a verification never arrived"
                time.sleep(0.05)
            for _ in range(2):  # the two whole-chain threads are taken
                assert running.acquire(timeout=30)
            time.sleep(0.2)  # the six others' last step after their key: taking their turn
            started = time.monotonic()
            with httpx.Client(
                base_url=gateway.url, headers={"Authorization": f"Bearer {newcomer}"}, timeout=60
            ) as client:
                assert client.get("/v1/models").status_code == 200
            assert time.monotonic() - started < 5
        finally:
            release.set()
        assert [f.result().status_code for f in verifies] == [200] * 8


def _slow_chain(gateway: Any, audited: dict[str, Any], tenant: str, count: int) -> None:
    """``count`` copies of the audited call in ``tenant``'s chain, each bound to a tool set of
    its own with 300 parameters: each costs the verifier a schema compiled (some 8 ms), so a
    whole-chain verification runs for seconds."""
    original = gateway.ledger.get(gateway.tenant, audited["receipt"]["id"])
    arguments = TOOL["function"]["parameters"]
    futures = []
    for n in range(count):
        extra = {f"p{n}_{k}": {"type": "string", "maxLength": 50} for k in range(300)}
        params = {**arguments, "properties": {**arguments["properties"], **extra}}
        tool = {
            "type": "object",
            "properties": {"tool": {"const": "set_alarm"}, "arguments": params},
        }
        schema = {"anyOf": [tool]}
        draft = ReceiptDraft(
            tenant=tenant,
            manifest={**original.manifest, "schema_hash": hash_json(schema)},
            schema=schema,
            request=original.request,
            output={
                **original.output,
                "tool_calls": [{**c, "id": new_call_id()} for c in original.tool_calls],
            },
            finish_reason=original.finish_reason,
            usage=original.usage,
            validation=original.validation,
            fallback=original.fallback,
            links=[],
        )
        futures.append(gateway.ledger.submit(draft))
    for future in futures:
        future.result()


def test_an_export_too_large_for_one_bundle_is_a_400_naming_what_to_do(
    gateway: Any, audited: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A chain of many distinct tool sets exported as a bundle `callproof verify` refused;
    the gateway now answers 400 `bundle_too_large` before streaming, and a shorter range
    exports. The bound is lowered here to 256 KiB of schemas (the real 256 MiB is exercised
    in tests/receipts/test_ledger_export.py)."""
    import time

    import receipts.bundle_writer
    from receipts.bundle_verify import verify_bundle

    tenant = "distinct-tool-sets"
    _slow_chain(gateway, audited, tenant, 30)  # a tool union of some 14 KB each
    time.sleep(0.01)
    _slow_chain(gateway, audited, tenant, 10)
    monkeypatch.setattr(receipts.bundle_writer, "MAX_SMALL_TOTAL", 256 << 10)
    with gateway.auditor_of(tenant) as client:
        error = error_of(client.get("/audit/export"), 400)
        assert (error["code"], error["param"]) == ("bundle_too_large", None)
        assert error["message"].startswith(f"a bundle of seqs 1..40 of chain {tenant!r} would")
        assert error["message"].endswith("export a shorter range of receipts")
        page = client.get("/audit/receipts", params={"limit": 1, "cursor": 30}).json()
        response = client.get("/audit/export", params={"since": page["items"][0]["created_at"]})
        assert response.status_code == 200, response.text
    bundle = tmp_path / "tail.tar.gz"
    bundle.write_bytes(response.content)
    pem = gateway.ledger.public_keys(tenant)[0]["public_key_pem"]
    report = verify_bundle(bundle, pinned=pem, allow_range=True)
    assert report.ok and (report.first_seq, report.last_seq) == (31, 40), report


def test_a_verify_whose_client_left_stops_and_a_tenant_has_one_at_a_time(
    gateway: Any, audited: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four whole-chain verifications whose clients gave up after 2 s still ran some 40 s
    each at 120k receipts, on the two threads every tenant's verifications and exports
    share, and a small one waited 167 s behind them. Now a tenant has one running or
    waiting at a time (another is a 429), and one whose client has gone stops at once."""
    import time

    tenant = "slow-chain"
    _slow_chain(gateway, audited, tenant, 1200)
    with gateway.auditor_of(tenant) as client:
        started = time.monotonic()
        whole = client.post("/audit/verify", json={})  # how long the whole chain takes
        took = time.monotonic() - started
        assert whole.status_code == 200 and whole.json()["ok"], whole.text
        assert took > 4, f"the chain verifies in {took:.1f} s: too fast to tell"

        verify, began = gateway.ledger.verify, threading.Event()

        def watched_verify(*args: Any, **kwargs: Any) -> Any:
            began.set()
            return verify(*args, **kwargs)

        monkeypatch.setattr(gateway.ledger, "verify", watched_verify)
        host, port = gateway.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as abandoned:  # closed when told
            auth = client.headers["authorization"]
            abandoned.sendall(
                b"POST /audit/verify HTTP/1.1\r\nHost: gw\r\n"
                + f"Authorization: {auth}\r\nContent-Type: application/json\r\n".encode()
                + b"Content-Length: 2\r\n\r\n{}"
            )
            assert began.wait(10)  # it holds the tenant's turn
            busy = client.post("/audit/verify", json={"from_seq": 1, "to_seq": 1})
            assert busy.status_code == 429, busy.text
            assert busy.json()["error"]["type"] == "rate_limit_error"
            assert busy.json()["error"]["code"] == "rate_limit_exceeded"
            with gateway.http("auditor") as other:  # another tenant is served meanwhile
                assert other.post("/audit/verify", json={"to_seq": 1}).status_code == 200
        gave_up = time.monotonic()
        while (small := client.post("/audit/verify", json={"to_seq": 1})).status_code == 429:
            assert time.monotonic() - gave_up < took / 2, "the abandoned verification ran on"
            time.sleep(0.1)
        assert small.status_code == 200 and small.json()["ok"], small.text


def test_an_export_streams_while_it_is_written_and_stops_when_its_client_leaves(
    gateway: Any, audited: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An export was written whole to a temporary file before its first byte left: at a
    million receipts some 90 s of silence, past a proxy's read timeout. Its bytes now leave
    as they are made. Here the writer is held once it has written 64 KiB: the client has its
    first bytes before it is let go, the tenant's turn is held until the download ends, the bundle
    verifies, and a client that leaves mid-download stops the writer and frees the turn."""
    import time

    from receipts.bundle_verify import verify_bundle

    tenant = "streamed-export"
    _slow_chain(gateway, audited, tenant, 300)  # big schemas: a bundle of some 350 KiB
    hold, held = threading.Event(), threading.Event()
    stopped: list[BaseException] = []
    asked_to_stop: list[Callable[[], bool]] = []
    export = gateway.ledger.export

    class HeldFile:
        def __init__(self, out: Any) -> None:
            self.out, self.written = out, 0

        def write(self, data: bytes) -> int:
            self.out.write(data)
            self.written += len(data)
            if self.written > 1 << 17 and not hold.is_set():
                held.set()
                assert hold.wait(30)
            return len(data)

        def flush(self) -> None:
            self.out.flush()

    def held_export(tenant: str, out: Any, **kwargs: Any) -> None:
        asked_to_stop.append(kwargs["should_stop"])
        try:
            export(tenant, HeldFile(out), **kwargs)
        except BaseException as exc:
            stopped.append(exc)
            raise

    monkeypatch.setattr(gateway.ledger, "export", held_export)
    bundle = tmp_path / "streamed.tar.gz"
    with gateway.auditor_of(tenant) as client:
        with client.stream("GET", "/audit/export") as response, bundle.open("wb") as out:
            assert response.status_code == 200
            chunks = response.iter_bytes()
            out.write(next(chunks))  # the first bytes, while the writer is still at work
            assert held.wait(10)
            assert client.get("/audit/export").status_code == 429  # its turn is held
            hold.set()
            for chunk in chunks:
                out.write(chunk)
        report = verify_bundle(
            bundle, pinned=gateway.ledger.public_keys(tenant)[0]["public_key_pem"]
        )
        assert report.ok and report.checked == 300, report

        hold.clear()
        held.clear()
        with client.stream("GET", "/audit/export") as response:
            chunks = response.iter_bytes()  # kept: an iterator dropped closes the connection
            next(chunks)
            assert held.wait(10)
        started = time.monotonic()
        while not asked_to_stop[-1]():  # the gateway has seen the client go
            assert time.monotonic() - started < 10, "the client's leaving was not noticed"
            time.sleep(0.05)
        hold.set()  # the writer goes on, finds its reader gone and stops
        started = time.monotonic()
        while (again := client.get("/audit/export")).status_code == 429:
            assert time.monotonic() - started < 10, "the abandoned export still holds the turn"
            time.sleep(0.1)
        assert again.status_code == 200
    assert [type(exc).__name__ for exc in stopped] == ["Stopped"]
