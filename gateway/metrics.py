"""Prometheus metrics of one gateway app, in its own registry (several apps can share a process).

The timing middleware also writes the JSON access log line (route template, status, latency;
no payloads, no keys), since both describe the same finished request, and gives each request
the id it answers in `x-request-id` and every log line names (gateway.logs.request_id).

HTTP requests and latency are labelled by route template (never by raw path, so ids do not
explode the label space) and status. Grammar cache figures are read from the engine's cache at
scrape time through a collector, so the hot path pays nothing for them; so are the receipts
waiting for the ledger's writer, and the process's CPU, memory and file descriptors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.logs import new_request_id, request_id

log = logging.getLogger("callproof.access")
# No `_created` series beside every counter: a timestamp per label set that no dashboard
# reads doubles what is scraped (process-wide, as prometheus_client keeps it).
disable_created_metrics()

GrammarStats = Callable[[], dict[str, dict[str, float]] | None]  # None: no in-process cache
QueuedAppends = Callable[[], int]

# A label per method a client can invent would grow the series without bound.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self, grammar_stats: GrammarStats, queued_appends: QueuedAppends):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "callproof_http_requests",
            "HTTP requests served",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "callproof_http_request_duration_seconds",
            "HTTP request latency",
            ["route", "method", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.stream_errors = Counter(
            "callproof_stream_errors",
            "Streams ended by an error event after their 200 status was sent, by error code",
            ["code"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "callproof_tokens", "Tokens processed by the engine", ["kind"], registry=self.registry
        )
        self.receipts = Counter(
            "callproof_receipts_appended",
            "Receipts committed to the ledger",
            registry=self.registry,
        )
        self.receipts_committed_late = Counter(
            "callproof_receipts_committed_late",
            "Receipts whose commit landed after their request had given up (a 503 at the"
            " database deadline, a client gone): each is logged with its request id",
            registry=self.registry,
        )
        self.append_latency = Histogram(
            "callproof_receipt_append_duration_seconds",
            "Time to commit one receipt",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_GrammarCacheCollector(grammar_stats))
        self.registry.register(_QueuedAppendsCollector(queued_appends))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """ASGI middleware timing every HTTP request; wrapped around the whole app, so requests
        no route matches (404, 405) are counted too, under route "unrouted"."""

        async def timed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            status, finished = 500, False
            started = time.perf_counter()
            rid = new_request_id()
            header = (b"x-request-id", rid.encode())
            context = request_id.set(rid)

            async def record_status(message: Message) -> None:
                nonlocal status, finished
                if message["type"] == "http.response.start":
                    status = message["status"]
                    message["headers"] = [*message.get("headers", ()), header]
                elif message["type"] == "http.response.body":
                    finished = not message.get("more_body", False)
                await send(message)

            failed = False
            try:
                await app(scope, receive, record_status)
            except Exception:
                failed = True
                raise
            finally:
                if status != 500 and not finished:
                    # A response cut off after its status: a stream whose client left is a
                    # 499 like any request whose client left (so the counts reconcile with
                    # the ledger), one the gateway failed to finish a 500.
                    status = 500 if failed else 499
                self._observe(scope, status, time.perf_counter() - started)
                request_id.reset(context)  # after the access line, which names it

        return timed

    def _observe(self, scope: Scope, status: int, elapsed: float) -> None:
        route = scope.get("path_template", "unrouted")
        method = scope["method"] if scope["method"] in _METHODS else "other"
        labels = (route, method, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(elapsed)
        log.info(
            "request",
            extra={
                "method": scope["method"],
                "route": route,
                "status": status,
                "ms": round(elapsed * 1000, 3),
            },
        )


class _GrammarCacheCollector(Collector):
    def __init__(self, stats: GrammarStats):
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._stats()
        if stats is None:  # grammars compile in the vLLM server, which has its own metrics
            return
        hits = CounterMetricFamily(
            "callproof_grammar_cache_hits", "Grammar cache hits", labels=["kind"]
        )
        misses = CounterMetricFamily(
            "callproof_grammar_cache_misses", "Grammar cache misses", labels=["kind"]
        )
        compiles = CounterMetricFamily(
            "callproof_grammar_compiles", "Grammar compiles finished", labels=["kind"]
        )
        failures = CounterMetricFamily(
            "callproof_grammar_compile_failures", "Grammar compiles that failed", labels=["kind"]
        )
        compile_time = CounterMetricFamily(
            "callproof_grammar_compile_seconds", "Total grammar compile time", labels=["kind"]
        )
        compile_max = GaugeMetricFamily(
            "callproof_grammar_compile_max_seconds", "Slowest grammar compile", labels=["kind"]
        )
        for kind, figures in stats.items():
            hits.add_metric([kind], figures.get("hits", 0))
            misses.add_metric([kind], figures.get("misses", 0))
            compiles.add_metric([kind], figures.get("compiles", 0))
            failures.add_metric([kind], figures.get("failures", 0))
            compile_time.add_metric([kind], figures.get("compile_ms_sum", 0.0) / 1000)
            compile_max.add_metric([kind], figures.get("compile_ms_max", 0.0) / 1000)
        yield from (hits, misses, compiles, failures, compile_time, compile_max)


class _QueuedAppendsCollector(Collector):
    """Receipts handed to the ledger's writer and not yet committed: a queue that grows while
    appends keep their latency says the database, not the gateway, is the bottleneck."""

    def __init__(self, queued: QueuedAppends):
        self._queued = queued

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "callproof_ledger_queued_appends",
            "Receipts waiting for the ledger's writer thread",
            value=self._queued(),
        )
