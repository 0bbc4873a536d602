"""A ledger database restored from a backup under a running gateway: the receipts it lost are
held by the agents that got them, so the gateway refuses the chain (a 503 naming the lost
seqs, which tells the OpenAI SDK not to retry) instead of signing a second history for those
seqs."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import chat_requests, fresh_gateway
from openai import InternalServerError, OpenAI

pytestmark = pytest.mark.model


def _copy(source: Path, target: Path) -> None:
    """SQLite's backup API: a consistent copy of a live database, into the same file."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def test_a_chain_the_restore_moved_back_is_refused_with_the_lost_seqs(
    gateway_engine: Any, server_loop: Any, tmp_path: Path
) -> None:
    db = tmp_path / "ledger.db"
    body = {
        "model": gateway_engine.identity.model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 2,
    }
    url = f"sqlite:///{db}"
    with fresh_gateway(gateway_engine, server_loop, tmp_path, url) as (base, secret, ledger):
        auth = {"Authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=base, headers=auth, timeout=120) as client:
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            _copy(db, tmp_path / "backup.db")  # the nightly backup, at seq 1
            for _ in range(2):
                assert client.post("/v1/chat/completions", json=body).status_code == 200
            _copy(tmp_path / "backup.db", db)  # restored in place under the running gateway
            refused = client.post("/v1/chat/completions", json=body)
            # the SDK would send it twice more after a Retry-After; it obeys this header
            assert refused.headers.get("x-should-retry") == "false", refused.headers
            assert "retry-after" not in refused.headers
            before = chat_requests(client, 503)
            sdk = OpenAI(base_url=f"{base}/v1", api_key=secret)  # max_retries 2, its default
            with pytest.raises(InternalServerError):
                sdk.chat.completions.create(**body)
            assert chat_requests(client, 503) == before + 1  # one request, no retries
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "ledger_unavailable"
        assert "went back from seq 3 to seq 1" in error["message"], error
        assert "receipts 2..3 are gone" in error["message"]
        assert ledger.reach("acme") == 1  # nothing sealed onto the restored chain
