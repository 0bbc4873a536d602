"""`callproof export`, `callproof verify` and `callproof ledger verify|migrate`.

Exit codes: 0 everything holds; 1 verification failed (the first failing seq and the reason
are printed); 2 bad input (arguments, a missing file, a malformed key, no chain to verify);
3 the database is unavailable. `verify` needs only receipts/ (no database, no server).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

    from gateway.settings import Settings
    from receipts.signing import Signer

OK, FAILED, BAD_INPUT, UNAVAILABLE = 0, 1, 2, 3


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
        " when it exists; without one, the bundle ends at the latest stored checkpoint)",
    )
    export.set_defaults(handler=_export)

    verify = subparsers.add_parser("verify", help="verify an export bundle offline")
    verify.add_argument("bundle", type=Path)
    verify.add_argument(
        "--range",
        action="store_true",
        help="accept a bundle of part of the chain (an export with --from/--to, or since/until"
        " over HTTP); without it"
        " the bundle must hold every receipt its checkpoint signs",
    )
    verify.add_argument(
        "--chain",
        metavar="TENANT",
        help="the chain the bundle must be of (a bundle of any other fails, look-alike names"
        " included)",
    )
    _add_report_options(verify)
    verify.set_defaults(handler=_verify_bundle)

    ledger = subparsers.add_parser("ledger", help="verify or migrate the ledger database")
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
    _add_report_options(db_verify)
    db_verify.set_defaults(handler=_verify_db)
    migrate = actions.add_parser("migrate", help="create or upgrade the ledger tables")
    _add_db(migrate)
    migrate.set_defaults(handler=_migrate)


def _add_db(parser: argparse.ArgumentParser) -> None:
    """The database `serve` uses, found the same way: --db, --data-dir, --config and their
    environment variables (docs/configuration.md)."""
    from gateway.settings import DATABASE_SETTINGS, add_arguments

    add_arguments(parser, only=DATABASE_SETTINGS)


def _db_url(settings: Settings) -> str:
    """The ledger URL, named on stderr; an existing, migrated one only (reading must not
    create an empty SQLite file, and tables that are not there are a setup step missed, not
    an outage)."""
    import sqlalchemy as sa

    from gateway.boot import database_state, newer_database, say_ledger, shown_url
    from gateway.settings import SettingsError
    from receipts.errors import LedgerUnavailable
    from receipts.ledger_file import sqlite_file
    from receipts.store import short_error

    url = settings.db_url
    try:
        state, revision = database_state(url)
    except sa.exc.SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger database is unavailable: {short_error(exc)}") from None
    if state == "absent":
        raise FileNotFoundError(f"no ledger at {sqlite_file(url)} (pass --db or --data-dir)")
    if state == "unmigrated":
        raise SettingsError(
            f"no ledger tables in {shown_url(url)}: run `callproof ledger migrate` first"
        )
    if state == "newer":  # "behind" has the ledger's tables: an older one reads as it was
        raise SettingsError(newer_database(url, revision))
    say_ledger(url)
    return url


def _add_report_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--public-key",
        type=Path,
        metavar="FILE",
        help=(
            "trust only these keys: PEM public key(s), or the JSON saved from GET /audit/keys,"
            " whose seq ranges then hold retired keys to the receipts they signed"
        ),
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        metavar="JSON",
        help="a signed checkpoint saved earlier (GET /audit/checkpoints/latest): the receipts"
        " must still reach its root, so a chain rewritten or cut back since fails",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON report")


def _export(args: argparse.Namespace) -> int:
    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from receipts.errors import LedgerUnavailable, ReceiptsError
    from receipts.ledger import Ledger
    from receipts.signing import Signer

    if args.since and args.until and args.since > args.until:
        return _fail(BAD_INPUT, "--from must not be after --to")
    try:
        settings = settings_from_args(args, only=(*DATABASE_SETTINGS, "signing_key_file"))
        signer = (
            Signer.from_pem(args.signing_key.read_bytes())
            if args.signing_key
            else _gateway_signer(settings)
        )
        with Ledger(_db_url(settings), signer) as ledger:
            tenant = args.tenant or _only_chain(ledger.chains())
            ledger.export(tenant, args.output, since=args.since, until=args.until)
    except LedgerUnavailable as exc:
        return _fail(UNAVAILABLE, exc)
    except (ReceiptsError, SettingsError, OSError) as exc:
        return _fail(BAD_INPUT, exc)
    print(f"wrote {args.output} (chain {tenant!r})")
    return OK


def _time(text: str) -> datetime:
    """An argparse type: a bad time is a usage error (exit 2), before any database opens."""
    from receipts.errors import ReceiptFormatError
    from receipts.queries import parse_time

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


def _verify_bundle(args: argparse.Namespace) -> int:
    from receipts.bundle_verify import verify_bundle
    from receipts.errors import ReceiptsError

    try:
        pem = args.public_key.read_bytes() if args.public_key else None
        saved = _saved_checkpoints(args)
        _check_gzip(args.bundle)
        with _progress(args.json) as progress:
            report = verify_bundle(
                args.bundle, pem, progress, allow_range=args.range, saved=saved, chain=args.chain
            )
    except (ReceiptsError, OSError, ValueError) as exc:
        return _fail(BAD_INPUT, exc)
    return _report([report.to_json_obj()], args.json)


def _verify_db(args: argparse.Namespace) -> int:
    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from receipts.errors import LedgerUnavailable, ReceiptsError
    from receipts.ledger import Ledger

    if (args.from_seq is not None or args.to_seq is not None) and not args.tenant:
        # chains differ in length: one range over all of them is past some chain's head
        return _fail(BAD_INPUT, ValueError("a seq range is of one chain: give --tenant too"))
    try:
        keyring = None
        if args.public_key:
            from receipts.trust import pinned_keys

            keyring = pinned_keys(args.public_key.read_bytes())
        saved = _saved_checkpoints(args)
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
        return _fail(UNAVAILABLE, exc)
    except (ReceiptsError, SettingsError, OSError, ValueError) as exc:
        return _fail(BAD_INPUT, exc)
    return _report(reports, args.json)


def _migrate(args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from gateway.boot import prepare_database, say_ledger
    from gateway.settings import DATABASE_SETTINGS, SettingsError, settings_from_args
    from migrations.runner import MigrationError, current

    try:
        settings = settings_from_args(args, only=DATABASE_SETTINGS)
        prepare_database(settings)  # as serve does: a new SQLite file is made private first
        say_ledger(settings.db_url)
        print(f"database at revision {current(settings.db_url)}")
    except (SettingsError, MigrationError, OSError) as exc:
        return _fail(BAD_INPUT, exc)
    except sa.exc.SQLAlchemyError as exc:
        return _fail(UNAVAILABLE, exc)
    return OK


def _check_gzip(bundle: Path) -> None:
    """A file that is not even gzip (keys.json given as the bundle) is a mistake on the
    command line, exit 2; an archive that fails its checks is a failed verification, exit 1.
    A missing file is left to verify_bundle, which says so."""
    from receipts.errors import BundleError

    if bundle.is_file():
        with bundle.open("rb") as file:
            if file.read(2) != b"\x1f\x8b":
                raise BundleError(f"{bundle} is not an export bundle (a .tar.gz archive)")


def _saved_checkpoints(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The checkpoint given with --checkpoint; a file that is not one (keys.json in its place)
    is bad input, exit 2, not a verification that failed."""
    from receipts.checkpoint import check_checkpoint
    from receipts.errors import ReceiptFormatError

    if not args.checkpoint:
        return []
    try:
        saved = json.loads(args.checkpoint.read_text())
        check_checkpoint(saved)
    except ValueError as exc:  # not JSON, or ReceiptFormatError: not a checkpoint's shape
        raise ReceiptFormatError(
            f"--checkpoint {args.checkpoint} is not a checkpoint saved from"
            f" GET /audit/checkpoints/latest: {exc}"
        ) from None
    return [saved]


def _report(reports: list[dict[str, Any]], as_json: bool) -> int:
    from receipts.chain import VerificationReport

    ok = all(r["ok"] for r in reports)
    if as_json:
        print(json.dumps(reports[0] if len(reports) == 1 else {"ok": ok, "chains": reports}))
        return OK if ok else FAILED
    for r in reports:
        chain = r.get("chain")
        if r["ok"]:
            size = f", Merkle root at tree size {r['tree_size']}" if r.get("tree_size") else ""
            span = ""
            if (
                r.get("first_seq")
                and r.get("tree_size")
                and not VerificationReport(**r).whole_chain
            ):
                span = f" (seq {r['first_seq']}..{r['last_seq']} of tree size {r['tree_size']})"
            print(f"OK: chain {chain!a}, {r['checked']} receipts verified{span}{size}")
        else:
            # no chain when the bundle was refused before its receipts were read
            named = f"chain {chain!a}" if chain else ""
            seq = f"at seq {r['first_failure_seq']}" if r["first_failure_seq"] else ""
            where = " ".join(part for part in (named, seq) if part)
            print(f"FAILED: {where}: {r['reason']}" if where else f"FAILED: {r['reason']}")
        for note in r.get("notes") or ():
            print(f"note: {note}")
    return OK if ok else FAILED


def _fail(code: int, exc: BaseException | str) -> int:
    print(f"callproof: {exc}", file=sys.stderr)
    return code


class _progress:
    """A rich progress bar over ``progress(done, total)`` calls, only on a terminal."""

    def __init__(self, quiet: bool) -> None:
        self._bar: Any = None
        if not quiet and sys.stdout.isatty():
            from rich.progress import Progress

            self._bar = Progress(transient=True)

    def __enter__(self) -> Any:
        if self._bar is None:
            return None
        self._bar.start()
        task = self._bar.add_task("verifying receipts", total=None)
        return lambda done, total: self._bar.update(task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
