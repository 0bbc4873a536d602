"""`callproof vllm serve-local` stops its vLLM server when it is itself stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from callproof.devpg import free_port
from callproof.devvllm import _stop_signals_held


def _server_pids(port: int) -> list[int]:
    """Processes running the vLLM API server on `port` (read from /proc, no tools needed)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and str(port).encode() in argv:
            found.append(int(entry.name))
    return found


def test_sigterm_stops_the_vllm_server_it_started(tmp_path: Path) -> None:
    port = free_port()
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "callproof",
            "vllm",
            "serve-local",
            "--port",
            str(port),
            "--eager",
            "--log",
            str(tmp_path / "vllm.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not _server_pids(port):
            assert time.monotonic() < deadline, "the vLLM server never started"
            assert cli.poll() is None, "callproof vllm serve-local exited early"
            time.sleep(0.2)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(60) == 0
        deadline = time.monotonic() + 40
        while _server_pids(port):
            assert time.monotonic() < deadline, "the vLLM server outlived the CLI"
            time.sleep(0.5)
    finally:
        if cli.poll() is None:
            cli.kill()
        for pid in _server_pids(port):
            os.kill(pid, signal.SIGKILL)


def test_a_stop_signal_during_the_spawn_lands_after_the_server_is_known() -> None:
    """SIGTERM between the server's exec and `Popen` returning must not unwind past `start`
    (the server would run on with no `stop()` knowing it): it is delivered after the block."""

    def exit_now(signum: int, _frame: object) -> None:
        raise SystemExit(signum)

    before = signal.signal(signal.SIGTERM, exit_now)
    steps = []
    try:
        with pytest.raises(SystemExit), _stop_signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            steps.append("spawned")
        assert steps == ["spawned"]
        assert signal.getsignal(signal.SIGTERM) is exit_now
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_environment_without_vllm_is_named_with_what_to_do(tmp_path: Path) -> None:
    """Installed from a wheel there is no checkout with .venv-vllm: --venv names one."""
    missing = tmp_path / "no-vllm-here"
    cli = subprocess.run(
        [sys.executable, "-m", "callproof", "vllm", "serve-local", "--venv", str(missing)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert cli.returncode != 0
    assert f"no vLLM environment at {missing}" in cli.stderr and "--venv" in cli.stderr
    assert not _server_pids(8100)
