"""The Litestar application: controllers, dependency injection, errors, OpenAPI.

`create_app` takes already-open resources (engine, ledger, key store) and does no I/O, so a
process can serve several apps over one loaded engine (tests do: one per database) and the
caller that opened the resources closes them.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, YamlRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from gateway.admin import AdminKeysController
from gateway.apikeys import KeyStore
from gateway.audit import AuditController
from gateway.auth import Authenticator, KeyCall, current_principal
from gateway.body_deadline import body_deadline
from gateway.chat import ChatController
from gateway.completion import Completions
from gateway.errors import handle_exception, json_not_found
from gateway.health import HealthController
from gateway.ledger_read import LedgerRead, tenant_chain
from gateway.metrics import Metrics
from gateway.models import ModelsController
from gateway.openapi import StrictStructSchemaPlugin
from gateway.replay import ReplayTurns
from gateway.settings import Settings
from receipts.ledger import Ledger
from runtime.engines.base import Engine


def _singleton(value: Any) -> Provide:
    return Provide(lambda: value, sync_to_thread=False, use_cache=True)


def create_app(settings: Settings, engine: Engine, ledger: Ledger, keys: KeyStore) -> Litestar:
    metrics = Metrics(grammar_stats=engine.grammar_stats, queued_appends=ledger.queued_appends)
    completions = Completions(engine, ledger, settings, metrics)
    key_call = KeyCall(settings.db_timeout_s)
    read = LedgerRead(settings.db_timeout_s)
    authenticator = Authenticator(keys, settings.key_cache_ttl_s, key_call)
    app = Litestar(
        route_handlers=[
            ChatController,
            ModelsController,
            AuditController,
            AdminKeysController,
            HealthController,
        ],
        dependencies={
            "completions": _singleton(completions),
            "ledger": _singleton(ledger),
            "read": _singleton(read),
            "keys": _singleton(keys),
            "replays": _singleton(ReplayTurns()),
            "key_call": _singleton(key_call),
            "metrics": _singleton(metrics),
            "authenticator": _singleton(authenticator),
            "principal": Provide(current_principal, sync_to_thread=False),
            "chain": Provide(tenant_chain, sync_to_thread=False),
        },
        state=State({"authenticator": authenticator}),  # for the guards (gateway.auth)
        exception_handlers={Exception: handle_exception},
        on_shutdown=[read.close],
        request_max_body_size=settings.max_body_bytes,
        plugins=[StrictStructSchemaPlugin()],
        openapi_config=OpenAPIConfig(
            title="callproof",
            version="1",
            description=(
                "OpenAI-compatible chat completions that commit a signed, hash-chained receipt "
                "for every tool call, and the audit API over those receipts."
            ),
            path="/schema",
            openapi_router=Router(
                "/schema", route_handlers=[], include_in_schema=False, after_request=json_not_found
            ),
            # The document only: Litestar's HTML viewers load their scripts from public CDNs,
            # code on the gateway's origin where an operator types API keys (and a blank page
            # on a network without internet access). Any OpenAPI viewer reads the document.
            render_plugins=[JsonRenderPlugin(), YamlRenderPlugin()],
            components=Components(
                security_schemes={
                    "apiKey": SecurityScheme(type="http", scheme="bearer", bearer_format="cp_...")
                }
            ),
        ),
        logging_config=None,  # logging is the process owner's (gateway.logs for `serve`)
        debug=False,
    )
    # Outside the router, unlike Litestar's middleware: a request that matches no route is
    # timed and logged as well, and so is a body that never arrives (the 408 inside).
    app.asgi_handler = metrics.middleware(body_deadline(app.asgi_handler, settings.body_timeout_s))
    return app
