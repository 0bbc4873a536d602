"""A real gateway on 127.0.0.1 for the OpenAI-SDK suite: real engine, real database, real keys.

Fixtures are session-scoped and parametrized twice, so every test runs against each
(engine, database) pair while the expensive parts happen once:

- ``gateway_engine``: one loaded engine per entry of GATEWAY_ENGINES. To run the whole suite
  on another engine, add one entry: a name, a factory ``(pytest.FixtureRequest) -> Engine``
  (it may start a server and register ``request.addfinalizer`` to stop it) and the marks of
  its tests (e.g. ``pytest.mark.vllm``). The engine is closed by this fixture.
- ``gateway``: a migrated SQLite file or a new database on the session's Postgres cluster,
  API keys for two tenants, a ledger with a fresh signing key, and the app served by uvicorn
  on a free port. All servers run on one background event loop, so an engine's asyncio
  objects always live on the same loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from callproof.devpg import free_port, scratch_database
from gateway.apikeys import KeyStore
from gateway.app import create_app
from gateway.boot import open_resources, prepare_database
from gateway.settings import Settings
from migrations.runner import upgrade
from receipts.ledger import Ledger
from receipts.signing import Signer
from runtime.engines.base import Engine

TENANT = "acme"
OTHER_TENANT = "globex"


def _embedded(request: pytest.FixtureRequest) -> Engine:
    from runtime.engines.embedded import EmbeddedEngine

    return EmbeddedEngine.load()


def _vllm(request: pytest.FixtureRequest) -> Engine:
    from runtime.engines.vllm import VllmEngine

    server = request.getfixturevalue("vllm_server")
    return VllmEngine(server.url, server.config.served_name, model_dir=server.config.model_dir)


@dataclass(frozen=True)
class EngineKind:
    make: Callable[[pytest.FixtureRequest], Engine]
    marks: tuple[pytest.MarkDecorator, ...] = ()


GATEWAY_ENGINES: dict[str, EngineKind] = {
    "embedded": EngineKind(_embedded, (pytest.mark.model,)),
    "vllm": EngineKind(_vllm, (pytest.mark.vllm,)),
}


class ServerLoop:
    """One asyncio loop in a daemon thread that runs every test server of the session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def serve(self, app: Any) -> tuple[str, Callable[[], None]]:
        """Start `app` on a free port; returns its base URL and a stop function."""
        port = free_port()
        # Idle connections kept past httpx's 5 s (uvicorn's default is also 5 s, timed from
        # an earlier moment): a client reusing one at 4.99 s could find it closed under it.
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_config=None, lifespan="on", timeout_keep_alive=30
        )
        server = uvicorn.Server(config)
        done = asyncio.run_coroutine_threadsafe(server.serve(), self.loop)
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            if server.started or done.done():
                break
            threading.Event().wait(0.05)
        if not server.started:
            done.result(5)  # surfaces the startup error
            raise RuntimeError("the test gateway did not start")

        def stop() -> None:
            server.should_exit = True
            done.result(30)

        return url, stop

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def chat_requests(client: httpx.Client, status: int) -> float:
    """How many POST /v1/chat/completions the gateway's /metrics counts with ``status`` so
    far (a running count: tests compare it before and after)."""
    series = 'callproof_http_requests_total{method="POST",route="/v1/chat/completions"'
    lines = client.get("/metrics").text.splitlines()
    wanted = [line for line in lines if line.startswith(series) and f'status="{status}"' in line]
    return sum(float(line.split()[-1]) for line in wanted)


@dataclass
class Gateway:
    """A running gateway and the credentials to use it."""

    url: str
    db_kind: str
    db_url: str
    settings: Settings
    engine: Engine
    ledger: Ledger
    keys: KeyStore
    signer: Signer
    secrets: dict[str, str] = field(default_factory=dict)  # agent, auditor, ...
    tenant: str = TENANT  # the agent's and the auditor's tenant; other_* keys are OTHER_TENANT

    @property
    def model(self) -> str:
        return self.engine.identity.model

    def openai(self, role: str = "agent") -> Any:
        from openai import OpenAI

        return OpenAI(
            base_url=self.url + "/v1", api_key=self.secrets[role], max_retries=0, timeout=120
        )

    def http(self, role: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.secrets[role]}"} if role else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def chat_requests(self, status: int) -> float:
        with self.http() as client:
            return chat_requests(client, status)

    def auditor_of(self, tenant: str) -> httpx.Client:
        """A client holding a new auditor key of ``tenant``: a chain the test makes its own."""
        headers = {"Authorization": f"Bearer {self.keys.create('auditor', tenant)[1]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@pytest.fixture(scope="session")
def server_loop() -> Iterator[ServerLoop]:
    loop = ServerLoop()
    yield loop
    loop.close()


@pytest.fixture(
    scope="session",
    params=[pytest.param(name, marks=kind.marks) for name, kind in GATEWAY_ENGINES.items()],
)
def gateway_engine(request: pytest.FixtureRequest, server_loop: ServerLoop) -> Iterator[Engine]:
    engine = GATEWAY_ENGINES[request.param].make(request)
    yield engine
    server_loop.run(engine.aclose())


def error_of(response: Any, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error of a response that must have `status`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["message"]
    return error


def gateway_settings(data_dir: Path, db_url: str, **overrides: Any) -> Settings:
    """Small token budgets keep the real model fast; payloads are retained for replay."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "db": db_url,
        "retain_payloads": True,
        "default_max_tokens": 64,
        "max_tokens_limit": 256,
        "key_cache_ttl_s": 0.5,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def gateway(
    request: pytest.FixtureRequest,
    gateway_engine: Engine,
    server_loop: ServerLoop,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp(f"gateway-{request.param}")
    with ExitStack() as cleanup:
        if request.param == "postgres":
            server = request.getfixturevalue("postgres_server_url")
            db_url = cleanup.enter_context(scratch_database(server, prefix="gw_"))
        else:
            db_url = f"sqlite:///{data_dir / 'ledger.db'}"
        yield from _serve_gateway(request.param, db_url, data_dir, gateway_engine, server_loop)


def _serve_gateway(
    db_kind: str, db_url: str, data_dir: Path, engine: Engine, server_loop: ServerLoop
) -> Iterator[Gateway]:
    settings = gateway_settings(data_dir, db_url)
    prepare_database(settings)
    signer = Signer.generate()
    resources = open_resources(settings, engine, signer)  # serve's own wiring
    ledger, keys = resources.ledger, resources.keys
    secrets = {
        "agent": keys.create("agent", TENANT)[1],
        "auditor": keys.create("auditor", TENANT)[1],
        "other_auditor": keys.create("auditor", OTHER_TENANT)[1],
        "other_agent": keys.create("agent", OTHER_TENANT)[1],
        "admin": keys.create("admin", "ops")[1],
    }
    url, stop = server_loop.serve(create_app(settings, engine, ledger, keys))
    yield Gateway(url, db_kind, db_url, settings, engine, ledger, keys, signer, secrets)
    stop()
    ledger.close()
    keys.close()


@contextmanager
def served_again(gateway: Gateway, server_loop: ServerLoop, **changes: Any) -> Iterator[Gateway]:
    """The session's gateway (its engine, ledger and key store) served by a second app with
    ``changes`` to its settings, for a test the shared app's settings do not fit."""
    settings = replace(gateway.settings, **changes)
    url, stop = server_loop.serve(
        create_app(settings, gateway.engine, gateway.ledger, gateway.keys)
    )
    try:
        yield replace(gateway, url=url, settings=settings)
    finally:
        stop()


@contextmanager
def fresh_gateway(
    engine: Engine, server_loop: ServerLoop, data_dir: Path, db_url: str, **settings: Any
) -> Iterator[tuple[str, str, Ledger]]:
    """A gateway on a ledger of its own at ``db_url`` (migrated here), with ``settings`` over
    the suite's: its URL, an agent key of tenant acme, and the ledger."""
    upgrade(db_url)
    ledger = Ledger(db_url, Signer.generate())
    keys = KeyStore.open(db_url)
    secret = keys.create("agent", TENANT)[1]
    app = create_app(gateway_settings(data_dir, db_url, **settings), engine, ledger, keys)
    url, stop = server_loop.serve(app)
    try:
        yield url, secret, ledger
    finally:
        stop()
        ledger.close()
        keys.close()
