"""A database that hangs (a frozen server, a partition: connections open, no bytes) must fail
closed in bounded time, like one that refuses connections: 503, never a request that waits
forever, and service again when it answers, with no restart."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from conftest import chat_requests, fresh_gateway, gateway_settings
from faults import PostgresProxy, hold_sealing

from gateway.apikeys import KeyStore
from gateway.app import create_app
from migrations.runner import upgrade
from receipts import ledger_writer
from receipts.ledger import Ledger
from receipts.signing import Signer

pytestmark = pytest.mark.model

TOOL = {
    "type": "function",
    "function": {
        "name": "ping",
        "parameters": {
            "type": "object",
            "properties": {"host": {"enum": ["alpha", "beta"]}},
            "required": ["host"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
def hung_db_gateway(
    fresh_postgres_url: str, gateway_engine: Any, server_loop: Any, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str], PostgresProxy]]:
    upgrade(fresh_postgres_url)
    proxy = PostgresProxy(sa.make_url(fresh_postgres_url).port)
    url = proxy.url(fresh_postgres_url)
    # db_timeout_s 2 s: the first commit (a new connection through the proxy, a forked
    # backend, an fsync) must land within it on a loaded machine
    settings = gateway_settings(tmp_path, url, db_timeout_s=2.0, key_cache_ttl_s=1.0)
    ledger = Ledger(url, Signer.generate())
    keys = KeyStore.open(url)
    secrets = {role: keys.create(role, "acme")[1] for role in ("agent", "auditor", "admin")}
    base, stop = server_loop.serve(create_app(settings, gateway_engine, ledger, keys))
    try:
        yield base, secrets, proxy
    finally:
        proxy.frozen.clear()
        stop()
        ledger.close()
        keys.close()
        proxy.close()


def ping(engine: Any) -> dict[str, Any]:
    """A greedy request for one call of TOOL: a receipt at stake."""
    return {
        "model": engine.identity.model,
        "messages": [{"role": "user", "content": "Ping alpha."}],
        "tools": [TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
    }


def client_as(base: str, secret: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=60)


def test_a_hung_database_is_503_in_bounded_time_and_service_returns(
    hung_db_gateway: tuple[str, dict[str, str], PostgresProxy], gateway_engine: Any
) -> None:
    base, secrets, proxy = hung_db_gateway
    client = client_as(base, secrets["agent"])
    body = ping(gateway_engine)
    first = client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200, first.text

    proxy.frozen.set()
    time.sleep(1.1)  # the cached key expires: the lookup goes to the hung database
    for path, method in (("/v1/models", "GET"), ("/readyz", "GET")):
        started = time.monotonic()
        response = client.request(method, path)
        assert response.status_code == 503, response.text
        assert time.monotonic() - started < 8, path  # timeouts of 2 s, on a busy VM
        if path == "/v1/models":  # no receipt was at stake: the message says what failed
            error = response.json()["error"]
            assert error["code"] == "ledger_unavailable", error
            assert error["message"].startswith("the API key database is unavailable"), error
    assert response.json()["database"] is False

    proxy.frozen.clear()
    assert client.get("/v1/models").status_code == 200  # the key is cached again, for 1 s
    proxy.frozen.set()  # now the commit, not the key lookup, meets the hung database
    started = time.monotonic()
    refused = client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "ledger_unavailable"
    assert refused.headers["retry-after"] == "1"  # the OpenAI SDK waits this long, then retries
    assert time.monotonic() - started < 30  # generation plus db_timeout_s, not forever

    proxy.frozen.clear()
    deadline = time.monotonic() + 30
    while (answer := client.post("/v1/chat/completions", json=body)).status_code != 200:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.5)
    assert client.get("/readyz").status_code == 200
    # The 503's receipt was never sealed (it used to commit once the database came back, a
    # receipt for calls its agent never got), nor any retry's: the chain goes on after `first`.
    assert answer.json()["receipt"]["seq"] == first.json()["receipt"]["seq"] + 1


def test_a_receipt_that_lands_after_its_503_is_logged_and_counted(
    hung_db_gateway: tuple[str, dict[str, str], PostgresProxy],
    gateway_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A commit already under way at the deadline may still land (docs/api.md): the request
    got a 503 and never its tool calls, yet the chain holds its receipt. The operator learns
    which: a log line naming the request id and the receipt, and a counter."""
    base, secrets, _ = hung_db_gateway
    client = client_as(base, secrets["agent"])
    body = ping(gateway_engine)
    seal = ledger_writer.seal

    def seal_slowly(*args: Any, **kwargs: Any) -> Any:
        time.sleep(4.0)  # past db_timeout_s (2 s), after the writer claimed the draft
        return seal(*args, **kwargs)

    monkeypatch.setattr(ledger_writer, "seal", seal_slowly)
    caplog.set_level(logging.WARNING, logger="callproof.gateway")
    refused = client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "ledger_unavailable"
    deadline = time.monotonic() + 30
    while not (late := [r for r in caplog.records if r.msg.startswith("receipt committed after")]):
        assert time.monotonic() < deadline, "the late commit was not logged"
        time.sleep(0.1)
    assert late[0].request_id == refused.headers["x-request-id"]
    assert late[0].seq == 1 and late[0].receipt_id.startswith("rcpt_")
    metrics = client.get("/metrics").text
    assert "callproof_receipts_committed_late_total 1.0" in metrics


def test_a_commit_that_never_ends_makes_the_gateway_not_ready(
    hung_db_gateway: tuple[str, dict[str, str], PostgresProxy],
    gateway_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer stays inside one transaction past db_timeout_s (a commit waiting for a
    synchronous standby that is gone): every request is a 503, and /readyz says so too,
    instead of 200 while the database still answered its reads."""
    base, secrets, _ = hung_db_gateway
    client = client_as(base, secrets["agent"])
    sealing, release = hold_sealing(monkeypatch)
    request = threading.Thread(
        target=client.post, args=("/v1/chat/completions",), kwargs={"json": ping(gateway_engine)}
    )
    request.start()
    try:
        assert sealing.wait(60), "the receipt never reached the writer"
        deadline = time.monotonic() + 15
        while (ready := client.get("/readyz")).status_code == 200:
            assert time.monotonic() < deadline, "still ready with the writer stuck"
            time.sleep(0.2)
        assert ready.status_code == 503 and ready.json()["database"] is False
    finally:
        release.set()
        request.join(60)
    deadline = time.monotonic() + 15
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "not ready again once the commit ended"
        time.sleep(0.2)


def test_an_audit_read_on_a_hung_database_is_503_in_bounded_time(
    hung_db_gateway: tuple[str, dict[str, str], PostgresProxy],
) -> None:
    base, secrets, proxy = hung_db_gateway
    auditor = client_as(base, secrets["auditor"])
    assert auditor.get("/audit/receipts").status_code == 200  # the key is cached, for 1 s
    proxy.frozen.set()  # the read, not the key lookup, meets the hung database
    started = time.monotonic()
    response = auditor.get("/audit/receipts")
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "ledger_unavailable"
    assert time.monotonic() - started < 8  # db_timeout_s is 2 s, on a busy VM
    proxy.frozen.clear()
    deadline = time.monotonic() + 30
    while auditor.get("/audit/receipts").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.5)


def test_key_management_on_a_hung_database_is_503_in_bounded_time(
    hung_db_gateway: tuple[str, dict[str, str], PostgresProxy],
) -> None:
    """The admin routes wait for the key store within db_timeout_s, as key lookups do."""
    base, secrets, proxy = hung_db_gateway
    admin = client_as(base, secrets["admin"])
    assert admin.get("/admin/keys").status_code == 200  # the key is cached, for 1 s
    proxy.frozen.set()
    started = time.monotonic()
    response = admin.post("/admin/keys", json={"role": "agent", "tenant": "acme"})
    assert response.status_code == 503, response.text
    assert "did not answer within db_timeout_s" not in response.text  # the log has the detail
    assert response.json()["error"]["message"].startswith("the API key database is unavailable")
    assert time.monotonic() - started < 8  # db_timeout_s is 2 s, on a busy VM
    proxy.frozen.clear()


def test_the_deadline_names_only_its_own_expiry() -> None:
    """A TimeoutError the work raises itself (a driver's) is not reported as the database
    missing db_timeout_s; the deadline's own expiry is, through the error given."""
    import asyncio

    from gateway.deadline import within_db_timeout
    from receipts.errors import LedgerUnavailable

    async def own_timeout() -> None:
        raise TimeoutError("the driver's")

    with pytest.raises(TimeoutError, match="the driver's"):
        asyncio.run(within_db_timeout(own_timeout(), 5, LedgerUnavailable, "the ledger database"))
    with pytest.raises(LedgerUnavailable, match=r"ledger database did not answer .*\(0.05 s\)"):
        asyncio.run(
            within_db_timeout(asyncio.sleep(5), 0.05, LedgerUnavailable, "the ledger database")
        )


def test_a_client_that_leaves_while_its_receipt_is_sealed_gets_a_499_and_a_logged_receipt(
    fresh_sqlite_url: str,
    gateway_engine: Any,
    server_loop: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client goes while the ledger's writer holds its receipt (a slow commit, a lock):
    the request is a 499, and the receipt that still lands is logged as committed late with
    the request's id. It used to be recorded as an ordinary 200 nobody read, and with the
    SDK's retry the chain held two receipts for one call with nothing tying them together."""
    sealing, release = hold_sealing(monkeypatch)
    caplog.set_level(logging.WARNING, logger="callproof.gateway")
    served = fresh_gateway(
        gateway_engine, server_loop, tmp_path, fresh_sqlite_url, db_timeout_s=60.0
    )
    with served as (base, secret, _):
        try:
            host, port = base.removeprefix("http://").rsplit(":", 1)
            body = httpx.Request(
                "POST",
                f"{base}/v1/chat/completions",
                json=ping(gateway_engine),
                headers={"Authorization": f"Bearer {secret}"},
            )
            head = "".join(f"{k}: {v}\r\n" for k, v in body.headers.items())
            with socket.create_connection((host, int(port))) as client:
                client.sendall(
                    f"POST /v1/chat/completions HTTP/1.1\r\n{head}\r\n".encode() + body.read()
                )
                assert sealing.wait(60), "the receipt never reached the writer"
            with httpx.Client(base_url=base) as http:
                deadline = time.monotonic() + 30
                while not chat_requests(http, 499):  # answered while the writer holds it
                    assert time.monotonic() < deadline, "the client's leaving was not noticed"
                    time.sleep(0.1)
            release.set()
            deadline = time.monotonic() + 30
            while not (
                late := [r for r in caplog.records if r.msg.startswith("receipt committed")]
            ):
                assert time.monotonic() < deadline, "the late commit was not logged"
                time.sleep(0.1)
            assert late[0].seq == 1
            with httpx.Client(base_url=base) as http:
                metrics = http.get("/metrics").text
            assert "callproof_receipts_committed_late_total 1.0" in metrics
        finally:
            release.set()
