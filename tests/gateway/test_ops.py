"""Operations: health, readiness, metrics, the OpenAPI document, key management, and the
ledger's database failing under a running gateway (503, nothing returned, then recovery)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa
from conftest import ServerLoop, served_again

from receipts.times import is_timestamp

pytestmark = pytest.mark.model

TOOL = {
    "type": "function",
    "function": {
        "name": "ping_host",
        "parameters": {
            "type": "object",
            "properties": {"host": {"type": "string", "enum": ["alpha", "beta"]}},
            "required": ["host"],
            "additionalProperties": False,
        },
    },
}


def test_health_and_readiness(gateway: Any) -> None:
    with gateway.http() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "engine": True, "database": True}


def wait_for_more(gateway: Any, status: int, before: float, what: str) -> None:
    deadline = time.monotonic() + 30
    while gateway.chat_requests(status) <= before:
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_client_that_leaves_mid_body_is_not_a_server_error(gateway: Any) -> None:
    """Half a body, then the connection closes: counted as 499 (client closed request),
    not as one of the gateway's own 500s."""
    left, failed = gateway.chat_requests(499), gateway.chat_requests(500)
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {gateway.secrets['agent']}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )

    wait_for_more(gateway, 499, left, "the half-sent request was not counted as 499")
    assert gateway.chat_requests(500) == failed


@pytest.mark.model
def test_a_client_that_times_out_stops_the_generation(gateway: Any) -> None:
    """The OpenAI SDK times out and goes: the gateway cancels the decode (the embedded engine
    is free again at once), counts a 499 and records nothing."""
    from datetime import UTC, datetime

    from receipts.queries import ReceiptQuery

    test_started = datetime.now(UTC)
    left = gateway.chat_requests(499)
    client = openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=gateway.secrets["agent"], max_retries=0, timeout=1
    )
    asked = gateway.settings.max_tokens_limit  # tokens that cannot end early: seconds of work
    with decode_steps(gateway) as steps:
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(
                model=gateway.model,
                messages=[{"role": "user", "content": "Write letters."}],
                max_tokens=asked,
                extra_body={"regex": "[a-z ]{900}"},
            )
        quick = gateway.openai().chat.completions.create(
            model=gateway.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
    assert steps is None or len(steps) < asked / 2, f"{len(steps)} steps: it decoded on"
    since = gateway.ledger.query(ReceiptQuery(tenant=gateway.tenant, since=test_started)).items
    assert [r.id for r in since] == [quick.model_extra["receipt"]["id"]]  # none abandoned
    wait_for_more(gateway, 499, left, "the timed-out request was not counted as 499")


@pytest.mark.model
def test_a_stream_whose_client_leaves_counts_as_499_not_200(gateway: Any) -> None:
    """The stream's 200 is sent with its first chunk; a client that goes after it left a
    request counted as a 200 with no receipt, and the counts no longer matched the ledger."""
    from datetime import UTC, datetime

    from receipts.queries import ReceiptQuery

    test_started = datetime.now(UTC)
    body = {
        "model": gateway.model,
        "messages": [{"role": "user", "content": "Write letters."}],
        "max_tokens": gateway.settings.max_tokens_limit,
        "regex": "[a-z ]{900}",
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {gateway.secrets['agent']}"}
    left = gateway.chat_requests(499)
    with (
        gateway.http() as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer,
    ):
        assert answer.status_code == 200
        next(answer.iter_lines())  # the role chunk: the status is sent; then the client goes
    wait_for_more(gateway, 499, left, "the abandoned stream was not counted as 499")
    assert not gateway.ledger.query(ReceiptQuery(tenant=gateway.tenant, since=test_started)).items


def letters_receipt(gateway: Any, role: str, max_tokens: int) -> str:
    """The receipt id of a greedy answer of exactly ``max_tokens`` tokens (letters that
    cannot end early): a replay that takes that long."""
    completion = gateway.openai(role).chat.completions.create(
        model=gateway.model,
        messages=[{"role": "user", "content": "Write letters."}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"regex": "[a-z ]{900}"},
    )
    return str(completion.model_extra["receipt"]["id"])


@pytest.mark.model
def test_an_auditor_who_leaves_stops_the_replay(gateway: Any) -> None:
    """Replays are engine time like an agent's request: abandoned ones ran to the end, one
    after another, and the agents' requests waited behind them."""
    replay = f"/audit/replay/{letters_receipt(gateway, 'agent', 128)}"
    headers = {"Authorization": f"Bearer {gateway.secrets['auditor']}"}
    with (
        decode_steps(gateway) as steps,
        httpx.Client(base_url=gateway.url, headers=headers, timeout=1) as auditor,
    ):
        for _ in range(3):
            try:
                refused = auditor.post(replay, json={})
            except httpx.ReadTimeout:
                continue
            # the one before left and is not yet seen gone: one replay per tenant
            assert refused.status_code == 429, refused.text
        gateway.openai().chat.completions.create(
            model=gateway.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
    assert steps is None or len(steps) < 3 * 128 / 2, f"{len(steps)} steps: they decoded on"


@pytest.mark.model
def test_a_tenant_has_one_replay_running_or_waiting(gateway: Any) -> None:
    """Replays take turns on the engine; one tenant's auditor used to queue any number in
    front of the others (four of 15 s each: another tenant's replay waited 75 s). A second
    replay of the same tenant is a 429 while its first runs; another tenant's waits only for
    the one running."""
    long = letters_receipt(gateway, "agent", 64)
    other = letters_receipt(gateway, "other_agent", 4)
    answers: dict[str, httpx.Response] = {}

    def replay(role: str, receipt_id: str) -> None:
        with gateway.http(role) as auditor:
            answers[role] = auditor.post(f"/audit/replay/{receipt_id}", json={})

    with decode_steps(gateway) as steps:
        first = threading.Thread(target=replay, args=("auditor", long))
        first.start()
        deadline = time.monotonic() + 60
        while steps is not None and not steps:  # the first replay is decoding
            assert time.monotonic() < deadline, "the replay never started"
            time.sleep(0.05)
        if steps is None:  # vLLM: no hook into its decoding; the request is under way
            time.sleep(0.5)
        with gateway.http("auditor") as auditor:
            again = auditor.post(f"/audit/replay/{long}", json={})
        replay("other_auditor", other)
        first.join(120)
    assert again.status_code == 429 and again.json()["error"]["code"] == "rate_limit_exceeded"
    assert answers["auditor"].status_code == 200 and answers["auditor"].json()["match"]
    assert answers["other_auditor"].status_code == 200, answers["other_auditor"].text


@contextmanager
def decode_steps(gateway: Any) -> Iterator[list[int] | None]:
    """The embedded model's forward passes while the block runs (one per decoded token): a
    decode its client abandoned stops at once, where a clock would also count the load.
    None on an engine whose model runs elsewhere (vLLM)."""
    if gateway.engine.identity.engine != "embedded":
        yield None
        return
    steps: list[int] = []
    hook = gateway.engine.model.register_forward_hook(lambda *_: steps.append(1))
    try:
        yield steps
    finally:
        hook.remove()


def cut_off_call(gateway: Any) -> dict[str, Any]:
    """A tool call max_tokens cuts off: a 422 (or a stream's error event), nothing receipted."""
    return {
        "model": gateway.model,
        "messages": [{"role": "user", "content": "Ping alpha."}],
        "tools": [TOOL],
        "tool_choice": "required",
        "max_tokens": 2,
    }


def test_metrics_in_prometheus_text(gateway: Any) -> None:
    gateway.openai().models.list()
    with gateway.http() as client:
        assert client.get("/no/such/route").status_code == 404
        assert client.delete("/healthz").status_code == 405
    with gateway.http("agent") as client:  # cut off by max_tokens after the 200 went out
        streamed = client.post(
            "/v1/chat/completions", json={**cut_off_call(gateway), "stream": True}
        )
        assert streamed.status_code == 200 and "structured_output_invalid" in streamed.text
    with gateway.http() as client:
        response = client.get("/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.text
    assert 'callproof_http_requests_total{method="GET",route="/v1/models",status="200"}' in text
    assert "callproof_http_request_duration_seconds_bucket" in text
    assert "_created" not in text
    assert 'callproof_http_requests_total{method="GET",route="unrouted",status="404"}' in text
    assert 'callproof_http_requests_total{method="DELETE",route="unrouted",status="405"}' in text
    assert 'callproof_stream_errors_total{code="structured_output_invalid"}' in text
    for name in (
        "callproof_receipts_appended_total",
        "callproof_receipt_append_duration_seconds_count",
        "callproof_tokens_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ):
        assert name in text
    # Every append above has returned, so none is waiting for the writer.
    assert "\ncallproof_ledger_queued_appends 0.0\n" in text
    if gateway.engine.grammar_stats() is not None:  # an in-process engine's cache
        for name in (
            "callproof_grammar_cache_misses_total",
            "callproof_grammar_compiles_total",
            "callproof_grammar_compile_seconds_total",
        ):
            assert f'{name}{{kind="tools"}}' in text, name


def test_tokens_count_what_the_engine_did_receipted_or_not(gateway: Any) -> None:
    """callproof_tokens_total is the engine's work: a tool call cut off by max_tokens (a 422,
    nothing receipted) counts its tokens, streamed or not."""

    def completion_tokens() -> float:
        with gateway.http() as client:
            text = client.get("/metrics").text
        line = next(
            x
            for x in text.splitlines()
            if x.startswith('callproof_tokens_total{kind="completion"}')
        )
        return float(line.rsplit(" ", 1)[1])

    body = cut_off_call(gateway)
    for stream in (False, True):
        before = completion_tokens()
        with gateway.http("agent") as client:
            response = client.post("/v1/chat/completions", json={**body, "stream": stream})
        assert "structured_output_invalid" in response.text
        assert completion_tokens() == before + 2, stream


def test_openapi_document_is_served(gateway: Any) -> None:
    with gateway.http() as client:
        document = client.get("/schema/openapi.json").json()
        assert client.get("/schema/openapi.yaml").status_code == 200
        for viewer in ("/schema/swagger", "/schema/redoc", "/schema/elements", "/schema/rapidoc"):
            missing = client.get(viewer)  # scripts from public CDNs
            assert missing.status_code == 404, viewer
            assert missing.json()["error"]["code"] == "not_found", viewer
    paths = document["paths"]
    for path in (
        "/v1/chat/completions",
        "/v1/models",
        "/audit/receipts",
        "/audit/export",
        "/audit/replay/{receipt_id}",
        "/admin/keys",
        "/readyz",
    ):
        assert path in paths, path
    schemas = document["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]
    assert request["additionalProperties"] is False
    assert {"messages", "tools", "tool_choice", "regex", "grammar"} <= set(request["properties"])
    fields = request["properties"]  # bounds of optional fields (Litestar alone drops them)
    assert (fields["temperature"]["minimum"], fields["temperature"]["maximum"]) == (0, 2)
    assert (fields["top_p"]["minimum"], fields["top_p"]["maximum"]) == (0, 1)
    stop_string = {"type": "string", "minLength": 1, "maxLength": 256}
    assert stop_string in fields["stop"]["oneOf"]
    assert {"type": "array", "items": stop_string, "maxItems": 4} in fields["stop"]["oneOf"]
    # parameters accepted only at "off" say so, and still admit null
    for name, off in (("n", 1), ("frequency_penalty", 0), ("top_logprobs", 0), ("logprobs", False)):
        assert {"type": "null"} in fields[name]["oneOf"], name
        assert [m["const"] for m in fields[name]["oneOf"] if "const" in m] == [off], name
    assert {"type": "object", "maxProperties": 0} in [
        {k: m[k] for k in ("type", "maxProperties") if k in m} for m in fields["metadata"]["oneOf"]
    ]
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(chat["200"]["headers"]) == {"X-Callproof-Receipt"}
    assert {"schema", "raw_output", "pointer", "differences"} <= set(
        schemas["ErrorDetail"]["properties"]
    )
    assert "413" not in document["paths"]["/audit/receipts"]["get"]["responses"]


def test_admin_key_api_and_revocation(gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="callproof.gateway")
    with gateway.http("admin") as admin:
        created = admin.post("/admin/keys", json={"role": "agent", "tenant": "acme"})
        assert created.status_code == 201, created.text
        key = created.json()
        assert key["secret"].startswith("cp_") and key["key"]["role"] == "agent"
        listed = admin.get("/admin/keys").json()
        assert key["key"]["id"] in [k["id"] for k in listed]
        assert all("secret" not in k and "key_hash" not in k for k in listed)
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key["secret"], max_retries=0)
        assert client.models.list().data[0].id == gateway.model  # now in the key cache
        revoked = admin.delete(f"/admin/keys/{key['key']['id']}")
        assert revoked.status_code == 200
        for moment in (key["key"]["created_at"], revoked.json()["revoked_at"]):
            assert is_timestamp(moment), moment  # written as receipts write times
        with pytest.raises(openai.AuthenticationError):  # at once: revoking drops the entry
            client.models.list()
        again = admin.delete(f"/admin/keys/{key['key']['id']}")  # idempotent, and not logged
        assert again.status_code == 200 and again.json() == revoked.json()
        assert admin.delete("/admin/keys/key_" + "0" * 16).status_code == 404
        assert admin.delete("/admin/keys/not-a-key-id").status_code == 400
        for bad, param in [
            ({"role": "root", "tenant": "acme"}, "role"),
            ({"role": "agent", "tenant": "a\x00b"}, "tenant"),
            ({"role": "agent", "tenant": "acme\n"}, "tenant"),  # Python's $ passes a last \n
            ({"role": "agent", "tenant": "acme", "name": "ops\n"}, "name"),
        ]:
            refused = admin.post("/admin/keys", json=bad)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    # Key management leaves a trail naming the admin key that acted, never a secret.
    admin_id = gateway.keys.lookup(gateway.secrets["admin"]).id
    trail = [(r.event, r.key_id, r.by_key_id) for r in caplog.records if hasattr(r, "by_key_id")]
    made = key["key"]["id"]
    assert trail == [("api_key_created", made, admin_id), ("api_key_revoked", made, admin_id)]
    assert key["secret"] not in caplog.text


# --------------------------------------------------------------------------- outage


@contextmanager
def sqlite_refuses_writes(db_url: str) -> Iterator[None]:
    """The disk refuses the SQLite write-ahead log (immutable file): commits fail with an I/O
    error, reads still work. Root bypasses permissions, not the immutable attribute."""
    wal = Path(db_url.removeprefix("sqlite:///") + "-wal")
    subprocess.run(["chattr", "+i", str(wal)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(wal)], check=True)


@contextmanager
def postgres_altered(db_url: str, setting: str, reset: str) -> Iterator[None]:
    """``ALTER DATABASE <db> <setting>`` with its sessions cut (so that it applies to the next
    ones), undone with ``reset`` and the sessions cut again."""
    name = db_url.rsplit("/", 1)[1]
    admin = sa.create_engine(db_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")

    def alter(sql: str) -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" {sql}')
            conn.exec_driver_sql(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            )

    alter(setting)
    try:
        yield
    finally:
        alter(reset)
        admin.dispose()


def postgres_refuses_connections(db_url: str) -> AbstractContextManager[None]:
    """The database stops accepting connections, as in a failover."""
    return postgres_altered(db_url, "ALLOW_CONNECTIONS false", "ALLOW_CONNECTIONS true")


def postgres_turns_read_only(db_url: str) -> AbstractContextManager[None]:
    """Sessions are read-only, as after a failover to a replica: reads (key lookups) work,
    commits fail."""
    return postgres_altered(
        db_url, "SET default_transaction_read_only = on", "RESET default_transaction_read_only"
    )


def call_tool(gateway: Any, **params: Any) -> Any:
    return gateway.openai().chat.completions.create(
        model=gateway.model,
        temperature=0,
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "Ping alpha."}],
        **params,
    )


def test_ledger_outage_fails_closed_and_recovers_without_restart(
    gateway: Any, server_loop: ServerLoop
) -> None:
    """Served with API keys cached for a minute: a key looked up before the outage is
    answered from the cache, so the append, not the key lookup (whose failure answers the
    same 503 and code), meets the outage."""
    with served_again(gateway, server_loop, key_cache_ttl_s=60) as cached:
        _outage_fails_closed_and_recovers(cached)


def _outage_fails_closed_and_recovers(gateway: Any) -> None:
    first = call_tool(gateway)  # the agent's key is cached from here
    outage = sqlite_refuses_writes if gateway.db_kind == "sqlite" else postgres_refuses_connections
    with outage(gateway.db_url):
        with pytest.raises(openai.InternalServerError) as caught:
            call_tool(gateway)
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "ledger_unavailable"
        assert caught.value.body["message"].startswith("the receipt ledger's database")
        assert caught.value.response.headers["retry-after"] == "1"
        if gateway.db_kind == "postgres":  # SQLite still answers reads: it stays "reachable"
            with gateway.http() as client:
                ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["database"] is False
    recovered = call_tool(gateway)
    first_seq = first.model_extra["receipt"]["seq"]
    assert recovered.model_extra["receipt"]["seq"] == first_seq + 1  # nothing was half-written
    assert gateway.ledger.verify(gateway.tenant).ok
    with gateway.http() as client:
        assert client.get("/readyz").status_code == 200


def test_a_stream_whose_receipt_cannot_commit_sends_no_tool_call(gateway: Any) -> None:
    """Streamed, the 200 has gone out before the commit: the call's deltas must not. The
    database refuses writes only (a full disk, a failover to a read-only replica), so the key
    lookup succeeds and the commit is what fails."""
    first = call_tool(gateway)
    refusing = sqlite_refuses_writes if gateway.db_kind == "sqlite" else postgres_turns_read_only
    with refusing(gateway.db_url):
        events = streamed_tool_call_events(gateway)
        with pytest.raises(openai.APIError, match="ledger's database is unavailable"):
            list(call_tool(gateway, stream=True))
        if gateway.db_kind == "postgres":  # it answers reads, but takes no receipt: not ready
            with gateway.http() as client:
                ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["database"] is False
    assert "[DONE]" not in events
    chunks = [json.loads(e) for e in events]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert not any(c.get("choices") and c["choices"][0]["delta"].get("tool_calls") for c in chunks)
    assert chunks[-1]["error"]["code"] == "ledger_unavailable", chunks[-1]
    recovered = call_tool(gateway, stream=True)
    receipts = [c.model_extra["receipt"] for c in recovered if c.model_extra.get("receipt")]
    assert [r["seq"] for r in receipts] == [first.model_extra["receipt"]["seq"] + 1]
    assert gateway.ledger.verify(gateway.tenant).ok


def streamed_tool_call_events(gateway: Any) -> list[str]:
    """The `data:` payloads of a streamed tool call, read as raw server-sent events."""
    with gateway.http("agent") as client:
        response = client.post(
            "/v1/chat/completions",
            json={
                "model": gateway.model,
                "temperature": 0,
                "tools": [TOOL],
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "messages": [{"role": "user", "content": "Ping alpha."}],
                "stream": True,
            },
        )
    assert response.status_code == 200, response.text
    prefix = "data: "
    return [line[len(prefix) :] for line in response.text.splitlines() if line.startswith(prefix)]


def test_json_logs_name_the_request_and_hold_no_payload_or_key(
    gateway: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each line is one JSON object; a request's lines carry the id its `x-request-id` header
    gives back (the SDK's `_request_id`); neither the messages nor the key ever appear."""
    import json
    import logging

    from gateway.logs import JsonFormatter, RequestIdFilter

    caplog.set_level(logging.INFO)
    caplog.handler.addFilter(RequestIdFilter())  # as configure_logging sets up `serve`'s
    marker = "zebra-quartz-7731"  # the payload that must not be logged
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model=gateway.model,
        messages=[
            {"role": "system", "content": f"Session {marker}."},
            {"role": "user", "content": "Ping alpha."},
        ],
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    )
    completion = raw.parse()
    assert len(raw.headers.get_list("x-request-id")) == 1
    rid = raw.headers["x-request-id"]
    assert rid.startswith("req_") and completion._request_id == rid
    with gateway.http(None) as client:  # a bad key: it must not be logged either
        client.get("/v1/models", headers={"Authorization": "Bearer cp_secret-that-must-not-leak"})
    lines = [JsonFormatter().format(record) for record in caplog.records]
    entries = [json.loads(line) for line in lines]
    mine = [e for e in entries if e.get("request_id") == rid]
    access = [e for e in mine if e["logger"] == "callproof.access"]
    assert [(e["route"], e["status"]) for e in access] == [("/v1/chat/completions", 200)]
    assert any(e["logger"] != "callproof.access" for e in mine)  # e.g. uvicorn.access here
    text = "\n".join(lines)
    assert marker not in text and "cp_secret-that-must-not-leak" not in text
    assert gateway.secrets["agent"] not in text
