"""`callproof keys create|list|revoke`: manage API keys in the gateway's database."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the import stays inside the handlers: `callproof --help` stays fast
    from gateway.apikeys import KeyStore

_LOCATION = ("data_dir", "db")


def register(subparsers: argparse._SubParsersAction) -> None:
    from gateway.settings import add_arguments

    parser = subparsers.add_parser("keys", help="create, list and revoke API keys")
    actions = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", help="create a key; its secret is printed alone on the last line"
    )
    create.add_argument("--role", required=True, choices=("agent", "auditor", "admin"))
    create.add_argument("--tenant", required=True)
    create.add_argument("--name")
    create.set_defaults(handler=_create)
    listing = actions.add_parser("list", help="list keys (never their secrets)")
    listing.set_defaults(handler=_list)
    revoke = actions.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id", metavar="ID")
    revoke.set_defaults(handler=_revoke)
    for sub in (create, listing, revoke):
        add_arguments(sub, only=_LOCATION)


def _store(args: argparse.Namespace) -> KeyStore:
    from gateway.apikeys import KeyStore
    from gateway.boot import prepare_database
    from gateway.settings import settings_from_args

    settings = settings_from_args(args)
    prepare_database(settings)
    return KeyStore.open(settings.db_url)


def _create(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        key, secret = store.create(args.role, args.tenant, args.name)
    except ValueError as exc:
        print(f"callproof keys create: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(
        f"created {key.role} key {key.id} for tenant {key.tenant!r}; the secret follows, "
        "shown only this once:"
    )
    print(secret)
    return 0


def _list(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        keys = store.list()
    finally:
        store.close()
    print(f"{'ID':<22} {'ROLE':<8} {'TENANT':<20} {'CREATED':<21}REVOKED")
    for key in keys:
        revoked = key.revoked_at.isoformat() if key.revoked_at else "-"
        print(
            f"{key.id:<22} {key.role:<8} {key.tenant:<20} {key.created_at:%Y-%m-%d %H:%M:%S}  {revoked}"
        )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from gateway.apikeys import KeyNotFound

    store = _store(args)
    try:
        key = store.revoke(args.key_id)
    except KeyNotFound as exc:
        print(f"callproof keys revoke: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(f"revoked {key.id} ({key.role}, tenant {key.tenant!r})")
    return 0
