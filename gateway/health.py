"""Operations endpoints, unauthenticated: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging

from litestar import Controller, Response, get
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec

from gateway.completion import Completions
from gateway.metrics import Metrics
from gateway.schemas import Readiness
from receipts.errors import LedgerUnavailable
from runtime.engines.base import Engine

# A probe that hangs is a "not ready" (orchestrators give up on probes after a second or so).
PROBE_TIMEOUT_S = 2.0

log = logging.getLogger("callproof.gateway")


async def check_engine_at_start(engine: Engine) -> None:
    """Ask the engine once at startup whether it can serve, so that the operator's log says
    why it cannot (the vLLM engine logs a wrong URL or model name itself) before any request
    fails; a gateway whose engine comes up later still starts."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            await engine.ready()
    except Exception as exc:  # noqa: BLE001 - a start-up diagnosis, never a reason to stop
        log.warning(
            "the engine could not say whether it is ready at start (%s: %s)",
            type(exc).__name__,
            exc,
            extra={"event": "engine_not_ready"},
        )


class HealthController(Controller):
    path = "/"
    tags = ["operations"]

    @get("/healthz", summary="Liveness: the process answers")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @get(
        "/readyz",
        summary="Readiness: engine loaded and database taking receipts (else 503)",
        responses={503: ResponseSpec(data_container=Readiness, description="Not ready")},
    )
    async def readyz(self, completions: NamedDependency[Completions]) -> Response[Readiness]:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                engine_ready = await completions.engine.ready()
        except Exception:  # noqa: BLE001 - an engine that cannot answer is not ready
            engine_ready = False
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await asyncio.to_thread(completions.ledger.ping, completions.settings.db_timeout_s)
            database = True
        except (LedgerUnavailable, TimeoutError):
            database = False
        ready = engine_ready and database
        body = Readiness("ready" if ready else "not ready", engine_ready, database)
        return Response(body, status_code=200 if ready else 503)

    @get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
    async def metrics(self, metrics: NamedDependency[Metrics]) -> Response[bytes]:
        # Litestar appends "; charset=utf-8" to text/* media types itself
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")
