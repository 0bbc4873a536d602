"""The `callproof` console script.

Each sub-command lives in its own module under callproof/commands/ and exposes
`register(subparsers)`; heavy imports (torch, the database) happen inside the
handlers so `callproof verify` stays fast and needs only receipts/.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: tuple[str, ...] = (
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
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
