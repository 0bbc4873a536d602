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
import sys
from collections.abc import Callable

from callproof.extras import MissingExtra, missing, require

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
        return int(args.handler(args) or 0)
    except MissingExtra as exc:  # a command listed without its extra
        print(f"callproof: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
