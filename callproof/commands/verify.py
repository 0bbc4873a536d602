"""`callproof verify`: an export bundle checked offline.

Exit codes (`callproof export` and `ledger` use the same): 0 everything holds; 1 verification
failed (the first failing seq and the reason are printed); 2 bad input (arguments, a missing
file, a malformed key, no chain to verify); 3 the database is unavailable. This module needs
only receipts/ and callproof's core dependencies (no database, no server, no model): it is
what `pip install callproof` gives an auditor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OK, FAILED, BAD_INPUT, UNAVAILABLE = 0, 1, 2, 3
EXTRA = None  # the core install
COMMANDS = ("verify",)


def register(subparsers: argparse._SubParsersAction) -> None:
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
    add_report_options(verify)
    verify.set_defaults(handler=_verify_bundle)


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """What to trust and how to print: the same for a bundle and for the database."""
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


def _verify_bundle(args: argparse.Namespace) -> int:
    from receipts.bundle_verify import verify_bundle
    from receipts.errors import ReceiptsError

    try:
        pem = args.public_key.read_bytes() if args.public_key else None
        saved = saved_checkpoints(args)
        _check_gzip(args.bundle)
        with _progress(args.json) as progress:
            report = verify_bundle(
                args.bundle, pem, progress, allow_range=args.range, saved=saved, chain=args.chain
            )
    except (ReceiptsError, OSError, ValueError) as exc:
        return fail(BAD_INPUT, exc, args.json)
    return print_reports([report.to_json_obj()], args.json)


def _check_gzip(bundle: Path) -> None:
    """A file that is not even gzip (keys.json given as the bundle) is a mistake on the
    command line, exit 2; an archive that fails its checks is a failed verification, exit 1.
    A missing file is left to verify_bundle, which says so."""
    from receipts.errors import VerifierInputError

    if bundle.is_file():
        with bundle.open("rb") as file:
            if file.read(2) != b"\x1f\x8b":
                raise VerifierInputError(f"{bundle} is not an export bundle (a .tar.gz archive)")


def saved_checkpoints(args: argparse.Namespace) -> list[dict[str, Any]]:
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


def print_reports(reports: list[dict[str, Any]], as_json: bool) -> int:
    """One line per chain (or one JSON document); the exit code says whether all held."""
    from receipts.chain import VerificationReport

    ok = all(r["ok"] for r in reports)
    if as_json:
        print(json.dumps(reports[0] if len(reports) == 1 else {"ok": ok, "chains": reports}))
        return OK if ok else FAILED
    for r in reports:
        chain = r.get("chain")
        if r["ok"]:
            size = ""
            if r.get("tree_size"):  # the root itself, to compare with a checkpoint kept
                size = f", Merkle root at tree size {r['tree_size']}: {r['root_hash']}"
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


def fail(code: int, exc: BaseException | str, as_json: bool = False) -> int:
    """The error on stderr, one line; ``code`` is the exit code. With ``as_json`` (a report
    asked for as --json) stdout gets it too, as ``{"ok": false, "error"}``: a program
    reading the report gets JSON whatever stopped the command."""
    if as_json:
        print(json.dumps({"ok": False, "error": str(exc)}))
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
