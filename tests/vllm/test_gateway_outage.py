"""The gateway in front of a real vLLM server that goes away and comes back.

While vLLM is down every chat request (plain and streaming) is a 503 in the OpenAI error
shape and the ledger gains nothing: no receipt for output that was never produced. When vLLM
is back on the same URL, the same gateway process serves again, without a restart. The app is
the real Litestar app (gateway.app.create_app) on a real SQLite ledger, driven in-process
over ASGI on the test's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from vllm_kit import engine_for, run

from callproof.devvllm import VllmServer
from gateway.apikeys import KeyStore
from gateway.app import create_app
from gateway.settings import Settings
from migrations.runner import upgrade
from receipts.ledger import Ledger
from receipts.queries import ReceiptQuery
from receipts.signing import Signer

pytestmark = pytest.mark.vllm

TENANT = "acme"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}},
            "required": ["city"],
        },
    },
}


def body(model: str, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 48,
        "stream": stream,
    }


def receipt_count(ledger: Ledger) -> int:
    return len(ledger.query(ReceiptQuery(tenant=TENANT, limit=1000)).items)


def test_vllm_down_means_503_and_no_receipt_then_recovery(
    vllm_server: VllmServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="callproof.gateway")
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(db_url)
    ledger = Ledger(db_url, Signer.generate(), retain_payloads=True)
    keys = KeyStore.open(db_url)
    agent_key = keys.create("agent", TENANT)[1]
    settings = Settings(data_dir=tmp_path, db=db_url, engine="vllm", default_max_tokens=48)
    try:
        run(_outage_and_recovery(vllm_server, settings, ledger, keys, agent_key))
    finally:
        ledger.close()
        keys.close()
    # The operator's log says why, not only the client: the URL it could not reach.
    outage = [r for r in caplog.records if getattr(r, "event", None) == "engine_error"]
    assert outage and all("unreachable" in r.detail for r in outage)


async def _outage_and_recovery(
    server: VllmServer, settings: Settings, ledger: Ledger, keys: KeyStore, agent_key: str
) -> None:
    engine = engine_for(server)
    model = engine.identity.model
    auth = {"Authorization": f"Bearer {agent_key}"}
    app = create_app(settings, engine, ledger, keys)
    transport = httpx.ASGITransport(app=app)  # the app runs on this loop, like the engine
    async with (
        engine,
        httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=120) as client,
    ):
        ok = await client.post("/v1/chat/completions", json=body(model), headers=auth)
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["message"]["tool_calls"]
        assert receipt_count(ledger) == 1
        assert (await client.get("/readyz")).status_code == 200

        await asyncio.to_thread(server.stop)
        try:  # the server is the session's: the later vLLM tests need it back whatever happens
            for stream in (False, True):
                down = await client.post(
                    "/v1/chat/completions", json=body(model, stream=stream), headers=auth
                )
                assert down.status_code == 503, down.text
                error = down.json()["error"]
                assert "unreachable" in error["message"] and error["code"] == "engine_unavailable"
            assert (await client.get("/readyz")).status_code == 503
            assert receipt_count(ledger) == 1  # nothing was receipted while vLLM was down
        finally:
            await asyncio.to_thread(server.start)
            await asyncio.to_thread(server.wait_healthy)
        back = await client.post("/v1/chat/completions", json=body(model), headers=auth)
        assert back.status_code == 200, back.text
        streamed = await client.post(
            "/v1/chat/completions", json=body(model, stream=True), headers=auth
        )
        assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
        assert receipt_count(ledger) == 3
        assert (await client.get("/readyz")).status_code == 200
        # the server compiles the grammars: no in-process cache figures, the rest as usual
        metrics = (await client.get("/metrics")).text
        assert "callproof_grammar_cache" not in metrics
        assert "callproof_receipts_appended_total 3.0" in metrics
