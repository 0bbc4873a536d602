"""`callproof serve --engine vllm` in its own process, as deployed, for the benchmarks that
measure the gateway in front of an upstream (bench.overhead, bench.vllm_path)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from callproof.devpg import free_port


@dataclass(frozen=True)
class RunningGateway:
    url: str
    pid: int
    agent_key: str


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    """Poll ``url`` until 200; fail fast, with the log's tail, if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{url}: the process exited with {process.returncode}\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready in {timeout:.0f} s (log: {log})")


@contextmanager
def running_gateway(
    upstream_url: str, model: str, db: str, workdir: Path, tenant: str = "bench"
) -> Iterator[RunningGateway]:
    """The gateway in front of ``upstream_url``, its ledger in ``db``, with an agent key of
    ``tenant`` made by `callproof keys create`; its log is ``workdir``/gateway.log."""
    cli = [sys.executable, "-m", "callproof"]
    location = ["--db", db, "--data-dir", str(workdir / "data")]
    created = subprocess.run(
        [*cli, "keys", "create", "--role", "agent", "--tenant", tenant, *location],
        check=True,
        capture_output=True,
        text=True,
    )
    key = created.stdout.strip().splitlines()[-1]
    port = free_port()
    log_path = workdir / "gateway.log"
    serve = [
        *cli,
        "serve",
        *location,
        "--port",
        str(port),
        "--engine",
        "vllm",
        "--vllm-url",
        upstream_url,
        "--model",
        model,
        "--log-level",
        "WARNING",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + "/readyz", process, 120, log_path)
            yield RunningGateway(url, process.pid, key)
        finally:
            process.terminate()
            process.wait(30)
