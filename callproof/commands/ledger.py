"""`callproof export` and `callproof ledger verify|backup|migrate`: the ledger database's
commands.

Their exit codes are `callproof verify`'s (callproof/commands/verify.py). They need the
gateway extra (the database drivers and the settings `serve` reads).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from callproof.commands.verify import (
    BAD_INPUT,
    OK,
    UNAVAILABLE,
    add_report_options,
    fail,
    print_reports,
    saved_checkpoints,
)

if TYPE_CHECKING:
    from datetime import datetime

    from gateway.settings import Settings
    from receipts.signing import PublicKeyEntry, Signer

EXTRA = "gateway"
COMMANDS = ("export", "ledger")


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser(
        "export", help="write a tenant's receipts to a bundle that verifies offline"
    )
    _add_db(export)
    export.add_argument("--tenant", help="the chain to export (default: the only one)")
    for flag, dest, end in (("--from", "since", "inclusive"), ("--to", "until", "exclusive")):
        export.add_argument(
            flag,
            dest=dest,
            type=_time,
            metavar="TIME",
            help=f"RFC 3339 with its offset (2026-11-22T16:00:00Z), {end}",
        )
    export.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="BUNDLE",
        help="the file to write, mode 0600 (with retain_payloads it holds every prompt)",
    )
    export.add_argument(
        "--signing-key",
        type=Path,
        metavar="PEM",
        help="private key to sign a checkpoint at the head (default: the gateway's, as serve"
        " finds it: $CALLPROOF_SIGNING_KEY, else signing_key_file or <data_dir>/signing-key.pem"
        " when it exists, unless a newer key has taken the chain over; without one, the"
        " bundle ends at the latest stored checkpoint)",
    )
    export.set_defaults(handler=_export)

    ledger = subparsers.add_parser("ledger", help="verify, back up or migrate the ledger database")
    actions = ledger.add_subparsers(dest="ledger_action", required=True, metavar="ACTION")
    db_verify = actions.add_parser("verify", help="verify the chains stored in the database")
    _add_db(db_verify)
    db_verify.add_argument("--tenant", help="one chain (default: every chain)")
    db_verify.add_argument(
        "--from-seq", type=int, metavar="N", help="first seq to verify, with --tenant (default: 1)"
    )
    db_verify.add_argument(
        "--to-seq",
        type=int,
        metavar="M",
        help="last seq to verify, with --tenant (default: the head)",
    )
    add_report_options(db_verify)
    db_verify.set_defaults(handler=_verify_db)
    backup = actions.add_parser(
        "backup", help="copy a SQLite ledger consistently while gateways write to it"
    )
    _add_db(backup)
    backup.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="FILE",
        help="the copy to write, mode 0600 (Postgres: use pg_dump, docs/deploy.md section 4)",
    )
    backup.set_defaults(handler=_backup)
    migrate = actions.add_parser("migrate", help="create or upgrade the ledger tables")
    _add_db(migrate)
    migrate.set_defaults(handler=_migrate)


def _add_db(parser: argparse.ArgumentParser) -> None:
    """The database `serve` uses, found the same way: --db, --data-dir, --config and their
    environment variables (docs/configuration.md)."""
    from gateway.settings import DATABASE_SETTINGS, add_arguments

    add_arguments(parser, only=DATABASE_SETTINGS)


def _db_url(settings: Settings) -> str:
    """The ledger URL, named on stderr before it is touched (a failure below names it too);
    an existing, migrated one only (reading must not create an empty SQLite file, and tables
    that are not there are a setup step missed, not an outage)."""
    import sqlalchemy as sa

    from gateway.boot import database_state, newer_database, say_ledger
    from gateway.settings import SettingsError
    from receipts.errors import LedgerUnavailable
    from receipts.ledger_file import sqlite_file
    from receipts.store import short_error
    from runtime.urls import hide_password

    url = settings.db_url
    say_ledger(url)
    try:
        state, revision = database_state(url)
    except sa.exc.SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger database is unavailable: {short_error(exc)}") from None
    if state == "absent":
        raise FileNotFoundError(f"no ledger at {sqlite_file(url)} (pass --db or --data-dir)")
    if state == "unmigrated":
        raise SettingsError(
            f"no ledger tables in {hide_password(url)}: run `callproof ledger migrate` first"
        )
    if state == "newer":  # "behind" has the ledger's tables: an older one reads as it was
        raise SettingsError(newer_database(url, revision))
    return url


def _export(args: argparse.Namespace) -> int:
    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from receipts.errors import LedgerUnavailable, ReceiptsError
    from receipts.ledger import Ledger
    from receipts.ledger_file import refuse_ledger_output, sqlite_file
    from receipts.signing import load_or_create_signer

    if args.since and args.until and args.since > args.until:
        return fail(BAD_INPUT, "--from must not be after --to")
    try:
        settings = settings_from_args(args, only=(*DATABASE_SETTINGS, "signing_key_file"))
        url = _db_url(settings)
        if (ledger_file := sqlite_file(url)) is not None:
            refuse_ledger_output(ledger_file, args.output)  # it was truncated to the bundle
        with Ledger(url, None) as reader:
            tenant = args.tenant or _only_chain(reader.chains())
            if args.signing_key:
                signer = load_or_create_signer(args.signing_key, create=False)
            else:
                signer = _current_signer(_gateway_signer(settings), reader.public_keys(tenant))
        with Ledger(url, signer) as ledger:
            ledger.export(tenant, args.output, since=args.since, until=args.until)
    except LedgerUnavailable as exc:
        return fail(UNAVAILABLE, exc)
    except (ReceiptsError, SettingsError, OSError) as exc:
        return fail(BAD_INPUT, exc)
    print(f"wrote {args.output} (chain {tenant!r})")
    return OK


def _time(text: str) -> datetime:
    """An argparse type: a bad time is a usage error (exit 2), before any database opens."""
    from receipts.errors import ReceiptFormatError
    from receipts.times import parse_time

    try:
        return parse_time(text)
    except ReceiptFormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _gateway_signer(settings: Settings) -> Signer | None:
    """The key `serve` signs with, if this machine has it; never a new one."""
    from receipts.signing import load_or_create_signer, signer_from_env

    from_env = signer_from_env()
    if from_env is not None:
        return from_env
    path = settings.signing_key_path
    return load_or_create_signer(path, create=False) if path.is_file() else None


def _current_signer(signer: Signer | None, chain_keys: list[PublicKeyEntry]) -> Signer | None:
    """The gateway's key, unless a newer key has taken the chain over: a scheduled export
    still finding the default key file after `serve` moved to another (key rotation) would
    sign a checkpoint with the retired key, which auditors holding the rotation's key list
    refuse. The bundle then ends at the latest stored checkpoint instead."""
    from receipts.signing import superseded_key

    if signer is None:
        return None
    moved_on = superseded_key(chain_keys, signer.key_id)
    if not moved_on:
        return signer
    newer = next(iter(moved_on.values()))
    print(
        f"callproof export: not signing with {signer.key_id}: {newer} has taken the chain"
        " over; the bundle ends at the latest stored checkpoint (pass --signing-key with"
        " the current key's file to sign one at the head)",
        file=sys.stderr,
    )
    return None


def _only_chain(chains: list[str]) -> str:
    from receipts.errors import OutOfRange

    _any_chain(chains, "export")
    if len(chains) > 1:
        raise OutOfRange(f"pass --tenant: the database holds chains {', '.join(chains)}")
    return chains[0]


def _any_chain(chains: list[str], what: str = "verify") -> list[str]:
    """Every chain, when there is one: a database with none (not the gateway's, named by a
    typo) printed 'no chains in the database' with exit 0, as if it had verified (or asked
    an export for a --tenant)."""
    from receipts.errors import OutOfRange

    if not chains:
        raise OutOfRange(
            f"no chains in this ledger: nothing to {what} (is it the gateway's database?"
            " --db, --data-dir, --config and their CALLPROOF_ variables name it)"
        )
    return chains


def _known_chain(tenant: str, chains: list[str]) -> str:
    """``tenant``, when the database holds its chain: a misspelt one verified as an empty,
    intact chain ('OK: 0 receipts verified')."""
    from receipts.errors import OutOfRange

    if tenant not in chains:
        listed = ", ".join(repr(chain) for chain in chains) or "none"
        raise OutOfRange(f"no chain {tenant!r} in the database; it holds chains {listed}")
    return tenant


def _verify_db(args: argparse.Namespace) -> int:
    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from receipts.errors import LedgerUnavailable, ReceiptsError
    from receipts.ledger import Ledger

    if (args.from_seq is not None or args.to_seq is not None) and not args.tenant:
        # chains differ in length: one range over all of them is past some chain's head
        message = "a seq range is of one chain: give --tenant too"
        return fail(BAD_INPUT, ValueError(message), args.json)
    try:
        keyring = None
        if args.public_key:
            from receipts.trust import pinned_keys

            keyring = pinned_keys(args.public_key.read_bytes())
        saved = saved_checkpoints(args)
        settings = settings_from_args(args, only=DATABASE_SETTINGS)
        with Ledger(_db_url(settings), None) as ledger:
            chains = ledger.chains()
            tenants = [_known_chain(args.tenant, chains)] if args.tenant else _any_chain(chains)
            reports = [
                ledger.verify(
                    tenant, args.from_seq, args.to_seq, keyring=keyring, saved=saved
                ).to_json_obj()
                for tenant in tenants
            ]
    except LedgerUnavailable as exc:
        return fail(UNAVAILABLE, exc, args.json)
    except (ReceiptsError, SettingsError, OSError, ValueError) as exc:
        return fail(BAD_INPUT, exc, args.json)
    return print_reports(reports, args.json)


def _backup(args: argparse.Namespace) -> int:
    import sqlite3

    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from receipts.errors import LedgerUnavailable, ReceiptsError
    from receipts.ledger_file import backup, sqlite_file

    try:
        settings = settings_from_args(args, only=DATABASE_SETTINGS)
        path = sqlite_file(_db_url(settings))
        if path is None:
            raise SettingsError(
                "ledger backup copies a SQLite ledger: back up Postgres with pg_dump or WAL"
                " archiving (docs/deploy.md, section 4)"
            )
        backup(path, args.output)
    except LedgerUnavailable as exc:
        return fail(UNAVAILABLE, exc)
    except sqlite3.Error as exc:
        return fail(UNAVAILABLE, f"the backup of {path} failed: {exc}")
    except (ReceiptsError, SettingsError, OSError) as exc:
        return fail(BAD_INPUT, exc)
    print(f"wrote {args.output}")
    return OK


def _migrate(args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from gateway.boot import prepare_database, say_ledger
    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from migrations.runner import MigrationError, current
    from receipts.errors import NotALedgerFile
    from receipts.store import short_error

    try:
        settings = settings_from_args(args, only=DATABASE_SETTINGS)
        say_ledger(settings.db_url)  # before it is touched: a failure below names it too
        prepare_database(settings)  # as serve does: a new SQLite file is made private first
        revision = current(settings.db_url)
    except (SettingsError, MigrationError, NotALedgerFile, OSError) as exc:
        return fail(BAD_INPUT, exc)
    except sa.exc.SQLAlchemyError as exc:
        return fail(UNAVAILABLE, f"the database is unavailable: {short_error(exc)}")
    print(f"database at revision {revision}")
    return OK
