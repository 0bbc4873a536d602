"""The `callproof` console script.

Each sub-command lives in its own module under callproof/commands/ and exposes
`register(subparsers)`, the `COMMANDS` it adds and the `EXTRA` it needs (None: the core
install). Heavy imports (torch, the database) happen inside the handlers so `callproof
verify` stays fast and needs only receipts/. A command whose extra is not installed is still
listed, and says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from callproof.extras import MissingExtra, missing, require

# What a shell reports for a command that SIGPIPE stopped (128 + 13): stdout's reader went
# away. Not 1 or 2, which `verify` and the others give their own meanings.
READER_GONE = 141

COMMAND_MODULES: tuple[str, ...] = (
    "callproof.commands.verify",
    "callproof.commands.model",
    "callproof.commands.generate",
    "callproof.commands.ledger",
    "callproof.commands.serve",
    "callproof.commands.keys",
    "callproof.commands.vllm",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="callproof",
        description="Auditable, receipt-producing gateway for LLM tool calling.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        module = importlib.import_module(module_name)
        if module.EXTRA is None or not missing(module.EXTRA):
            module.register(subparsers)
            continue
        for name in module.COMMANDS:
            absent = subparsers.add_parser(
                name,
                help=f"(needs: pip install 'callproof[{module.EXTRA}]')",
                add_help=False,
            )
            absent.set_defaults(handler=_needs(module.EXTRA, f"callproof {name}"), absent=True)
    return parser


def _needs(extra: str, what: str) -> Callable[[argparse.Namespace], None]:
    """The handler of a command listed without its extra: it raises MissingExtra."""
    return lambda args: require(extra, what)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "absent", False):  # a missing command takes any arguments
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # here, where a reader gone is caught, not at the interpreter's exit
    except MissingExtra as exc:  # a command listed without its extra
        print(f"callproof: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `callproof verify B | head -1`: nobody reads the rest
        return _reader_gone()
    return code


def _reader_gone() -> int:
    """Stop quietly, as `cat` does, when stdout's reader has gone: stdout goes to /dev/null so
    that the interpreter's last flush of what is still buffered does not fail again (Python's
    recipe, in the signal module's notes on SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return READER_GONE


if __name__ == "__main__":
    sys.exit(main())
