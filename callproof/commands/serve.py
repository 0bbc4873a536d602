"""`callproof serve`: run the gateway (embedded engine + SQLite under ./data by default)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import logging
import os
import sys
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import uvicorn

    from gateway.boot import Resources
    from receipts.signing import Signer

EXTRA = "gateway"
COMMANDS = ("serve",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the OpenAI-compatible gateway",
        description="Run the gateway. Every setting is also an env var CALLPROOF_<NAME> and a "
        "key of the --config file; see docs/configuration.md.",
    )
    from gateway.settings import add_arguments

    add_arguments(parser)
    parser.set_defaults(handler=run)


def _announcing_server_class() -> type[uvicorn.Server]:
    """Defined on first use: uvicorn costs `callproof verify` 130 ms to import."""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        """Says where it listens once it serves: an app that fails to start prints no
        "listening" line."""

        async def startup(self, sockets: list[Any] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                host, port = self.config.host, self.config.port
                print(f"callproof listening on {_url(host, port)}", flush=True)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """uvicorn raises the SIGTERM it caught again once it has shut down, which killed
            the process before the ledger closed (no closing checkpoints). The signal asked
            for a graceful stop, and `run` finishes one: closing, then exit 0."""
            with super().capture_signals():
                yield
                self._captured_signals.clear()

    return AnnouncingServer


def _url(host: str, port: int) -> str:
    """The gateway's base URL; an IPv6 host is bracketed (RFC 3986), since `http://::1:8000`
    is no URL a client can use."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from sqlalchemy.exc import SQLAlchemyError

    from callproof.cli import READER_GONE
    from callproof.extras import require
    from gateway.app import create_app
    from gateway.boot import (
        AdminKeyNotShown,
        PortInUse,
        check_engine_inputs,
        default_signer,
        listening_socket,
        load_engine,
        named_signer,
        open_resources,
        prepare_database,
        say_ledger,
    )
    from gateway.health import check_engine_at_start
    from gateway.logs import configure_logging
    from gateway.settings import SettingsError, settings_from_args
    from migrations.runner import MigrationError
    from receipts.errors import ReceiptsError
    from runtime.errors import EngineError

    listener = None
    try:  # everything an operator can get wrong is one line and exit 2, not a traceback
        settings = settings_from_args(args)
        configure_logging(settings.log_level)
        if settings.engine == "embedded":  # an extra: say so before anything else happens
            require(
                "embedded", 'the embedded engine (engine "embedded", the default; or --engine vllm)'
            )
        listener = listening_socket(settings)  # a port in use must create nothing
        check_engine_inputs(settings)
        signer = named_signer(settings)  # before anything is created: it needs no database
        say_ledger(settings.db_url)  # before it is touched: a failure below names it too
        prepare_database(settings)
        if signer is None:
            signer = default_signer(settings)  # before the engine: seconds to load a model
        resources = open_resources(settings, load_engine(settings), signer)
    except PortInUse as exc:
        return _cannot_start(exc, 3)
    except (
        SettingsError,
        ReceiptsError,
        EngineError,
        SQLAlchemyError,
        MigrationError,
        OSError,
        ImportError,
    ) as exc:
        if listener is not None:
            listener.close()
        return _cannot_start(exc, 2)
    print(f"callproof: signing receipts with {signer.key_id}", file=sys.stderr, flush=True)
    try:
        _announce(resources, signer)
        app = create_app(settings, resources.engine, resources.ledger, resources.keys)
        # At start, whatever keeps the engine from serving is logged (a wrong vLLM URL or model
        # name would otherwise show only as 503s); at shutdown the engine closes on the loop
        # that served, which owns its connections (the closing below runs on a new loop).
        app.on_startup.append(partial(check_engine_at_start, resources.engine))
        app.on_shutdown.append(resources.engine.aclose)
        # Everything built so far (engine, app, libraries) lives as long as the process: keep
        # it out of the cyclic GC's full collections, whose pauses were the p99 at load
        # (bench.overhead, concurrency 32: p99 160-180 ms without, 46-78 ms with).
        gc.freeze()
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None)
        server = _announcing_server_class()(config)
        server.run(sockets=[listener])
        code = 0 if server.started else 3  # 3: the app did not start (uvicorn logged why)
    except AdminKeyNotShown as exc:  # stdout's reader gone: what `cli` exits with for it
        code = _cannot_start(exc, READER_GONE if exc.reader_gone else 2)
    except BrokenPipeError:  # later: the "listening on" line
        print("callproof serve: stopped: stdout's reader has gone", file=sys.stderr)
        code = READER_GONE
    finally:
        listener.close()
        asyncio.run(resources.aclose())
    _exit_now(code)


def _announce(resources: Resources, signer: Signer) -> None:
    """What an operator must know before the gateway listens: a signing key that a newer one
    has superseded, and the first run's admin key (shown this once) or the lack of any."""
    from gateway.boot import first_run_admin_key
    from receipts.signing import superseded_key

    moved_on = superseded_key(resources.ledger.public_keys(), signer.key_id)
    if moved_on:
        chains = ", ".join(f"{chain!r} (now {newer})" for chain, newer in moved_on.items())
        print(
            f"callproof: warning: a newer key has taken over chain(s) {chains} since"
            f" {signer.key_id} did: is this a stale replica or a rolled-back secret?"
            " Signing with it again reopens its range (docs/deploy.md, key rotation)",
            file=sys.stderr,
            flush=True,
        )
    if first_run_admin_key(resources.keys, _show_admin_key):
        return
    if not resources.keys.has_admin(active=True):
        print(
            "callproof: every admin key is revoked; make one with"
            " `callproof keys create --role admin --tenant admin`",
            file=sys.stderr,
            flush=True,
        )


def _show_admin_key(secret: str) -> None:
    if sys.stdout is None:  # stdout closed (`>&-`): print would drop the secret unsaid
        raise OSError(errno.EBADF, "stdout is closed")
    print("First run: created an admin API key. It is shown only this once:", flush=True)
    print(secret, flush=True)


def _exit_now(code: int) -> NoReturn:
    """Exit once everything is closed, without the interpreter's teardown: all that is left
    for it to do is free the engine's libraries, and triton's (through torch) then prints
    "nanobind: leaked instances" lines onto stderr, where the JSON log lines go."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a reader that has gone (a closed pipe)
            stream.flush()
    os._exit(code)


def _cannot_start(exc: BaseException, code: int) -> int:
    """One line on stderr instead of a traceback; ``code`` as docs/configuration.md lists."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"callproof serve: cannot start: {detail}", file=sys.stderr)
    return code
