"""`callproof keys create|list|revoke`: manage API keys in the gateway's database."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the import stays inside the handlers: `callproof --help` stays fast
    from gateway.apikeys import KeyStore

EXTRA = "gateway"
COMMANDS = ("keys",)


def register(subparsers: argparse._SubParsersAction) -> None:
    from gateway.settings import DATABASE_SETTINGS, add_arguments

    parser = subparsers.add_parser("keys", help="create, list and revoke API keys")
    actions = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", help="create a key; its secret is printed alone on the last line"
    )
    create.add_argument(
        "--role",
        required=True,
        choices=("agent", "auditor", "admin"),
        help="agent: /v1 only; auditor: /audit, its tenant's chain only; admin: /admin",
    )
    create.add_argument(
        "--tenant", required=True, help="the tenant, whose receipt chain the key writes or reads"
    )
    create.add_argument("--name", help="a label for `keys list` (default: ROLE@TENANT)")
    create.set_defaults(handler=_create)
    listing = actions.add_parser("list", help="list keys (never their secrets)")
    listing.set_defaults(handler=_list)
    revoke = actions.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id", metavar="ID")
    revoke.set_defaults(handler=_revoke)
    for sub in (create, listing, revoke):
        add_arguments(sub, only=DATABASE_SETTINGS)


def _with_store(
    args: argparse.Namespace, action: str, use: Callable[[KeyStore], int], *, migrate: bool
) -> int:
    """``use`` on the key store `serve` would use, closed after; what an operator can get
    wrong is one line on stderr instead of a traceback: exit 2 for settings and arguments, 3
    for a database that fails. Only `create` sets a database up (it is what the deploy docs
    run before the first start); `list` and `revoke` read what is there."""
    import sqlalchemy as sa

    from gateway.apikeys import InvalidKeyField, KeyStore, KeyStoreUnavailable
    from gateway.boot import prepare_database, say_ledger
    from gateway.logs import configure_logging
    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from migrations.runner import MigrationError
    from receipts.errors import NotALedgerFile

    try:  # the database and the log level: serve's other settings are not checked here
        settings = settings_from_args(args, only=(*DATABASE_SETTINGS, "log_level"))
        say_ledger(settings.db_url)  # before it is touched: a failure below names it too
        if migrate:
            prepare_database(settings)
        else:
            _check_readable(settings.db_url)
        store = KeyStore.open(settings.db_url)
        configure_logging(settings.log_level)  # serve's JSON lines, for the key changes' trail
        try:
            return use(store)
        finally:
            store.close()
    except BrokenPipeError:  # an OSError, but stdout's reader gone is cli.main's to report
        raise
    except (SettingsError, MigrationError, InvalidKeyField, NotALedgerFile, OSError) as exc:
        code, message = 2, str(exc)
    except (KeyStoreUnavailable, sa.exc.SQLAlchemyError) as exc:
        code, message = 3, str(exc).strip().splitlines()[0]
    print(f"callproof keys {action}: {message}", file=sys.stderr)
    return code


def _check_readable(url: str) -> None:
    """`list` and `revoke` need the API key tables of this release, and never make them."""
    from gateway.boot import database_state, newer_database
    from gateway.settings import SettingsError
    from runtime.urls import hide_password

    state, revision = database_state(url)
    if state in ("absent", "unmigrated"):
        raise SettingsError(
            f"no gateway database at {hide_password(url)}: `callproof keys create`"
            " or `callproof serve` sets one up"
        )
    if state == "behind":
        raise SettingsError(
            f"the database at {hide_password(url)} is at revision {revision!r}, older than this"
            " release's API key tables: `callproof ledger migrate`, `callproof keys create`"
            " or `callproof serve` brings it up to date"
        )
    if state == "newer":
        raise SettingsError(newer_database(url, revision))


def _create(args: argparse.Namespace) -> int:
    from gateway.apikeys import log_key_change

    def use(store: KeyStore) -> int:
        key, secret = store.create(args.role, args.tenant, args.name)
        log_key_change("api key created", key, None)
        print(
            f"created {key.role} key {key.id} for tenant {key.tenant!r}; the secret follows, "
            "shown only this once:"
        )
        print(secret)
        return 0

    return _with_store(args, "create", use, migrate=True)


def _list(args: argparse.Namespace) -> int:
    def use(store: KeyStore) -> int:
        keys = store.list()  # before the header: a failing database prints no table
        rows = [("ID", "ROLE", "TENANT", "CREATED", "REVOKED", "NAME")]
        rows += [
            (key.id, key.role, key.tenant, _when(key.created_at), _when(key.revoked_at), key.name)
            for key in keys
        ]
        print(_table(rows))
        return 0

    return _with_store(args, "list", use, migrate=False)


def _when(moment: datetime | None) -> str:
    """One format for every time in the table, in UTC whatever zone the database answers in
    (a Postgres session's TimeZone); '-' for a key never revoked."""
    return "-" if moment is None else f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def _table(rows: list[tuple[str, ...]]) -> str:
    """Columns as wide as their widest cell and two spaces apart: fixed widths let a long
    tenant or time run into the next column. The last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]])
        for row in rows
    )


def _revoke(args: argparse.Namespace) -> int:
    from gateway.apikeys import KeyNotFound, log_key_change

    def use(store: KeyStore) -> int:
        try:
            key, now = store.revoke(args.key_id)
        except KeyNotFound as exc:
            print(f"callproof keys revoke: {exc}", file=sys.stderr)
            return 1
        if not now:  # the key is revoked, as asked: exit 0, but no revocation in the trail
            print(f"{key.id} was already revoked at {_when(key.revoked_at)}; nothing changed")
            return 0
        log_key_change("api key revoked", key, None)
        print(f"revoked {key.id} ({key.role}, tenant {key.tenant!r})")
        return 0

    return _with_store(args, "revoke", use, migrate=False)
