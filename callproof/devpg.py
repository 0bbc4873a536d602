"""A throwaway Postgres cluster for tests and benchmarks.

Starts the server binaries found on the machine (``/usr/lib/postgresql/*/bin``) on
127.0.0.1 and a free port, in a data directory owned by an unprivileged user: initdb and
postgres refuse to run as root, so when we are root they run as the ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No Postgres server binaries on this machine, or the cluster would not start."""


def find_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<N>/bin`` holding initdb, or $CALLPROOF_PG_BIN."""
    explicit = os.environ.get("CALLPROOF_PG_BIN")
    candidates = (
        [explicit]
        if explicit
        else sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    )
    for candidate in reversed(candidates):
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    raise PostgresUnavailable(
        "no Postgres server binaries found; install them (Debian: apt-get install postgresql) "
        "or set CALLPROOF_PG_BIN to the directory holding initdb"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _runner() -> tuple[list[str], int | None, int | None]:
    """Command prefix and uid/gid that run the server binaries as a non-root user."""
    if os.geteuid() != 0:
        return [], None, None
    user = pwd.getpwnam("postgres")
    prefix = ["runuser", "-u", "postgres", "--"] if shutil.which("runuser") else []
    return prefix, user.pw_uid, user.pw_gid


@contextmanager
def throwaway_postgres(database: str = "callproof") -> Iterator[str]:
    """Start a fresh cluster, create ``database`` and yield its SQLAlchemy URL; stop on exit."""
    bin_dir = find_bin_dir()
    prefix, uid, gid = _runner()
    root = Path(tempfile.mkdtemp(prefix="callproof-pg-"))
    data = root / "data"
    port = free_port()
    if uid is not None:
        os.chown(root, uid, gid)
    try:
        subprocess.run(
            [
                *prefix,
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            cwd=root,
        )
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='{root}'"
            " -c max_connections=200 -c fsync=on -c synchronous_commit=on"
        )
        subprocess.run(
            [
                *prefix,
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                opts,
                "-l",
                str(root / "log"),
                "-w",
                "-t",
                "60",
                "start",
            ],
            check=True,
            capture_output=True,
            cwd=root,
        )
        _wait_ready(port)
        subprocess.run(
            [
                *prefix,
                str(bin_dir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                database,
            ],
            check=True,
            capture_output=True,
            cwd=root,
        )
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"
    except subprocess.CalledProcessError as exc:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        raise PostgresUnavailable(
            f"{exc.cmd[len(prefix)]} failed: {exc.stderr.decode(errors='replace')}\n{log}"
        ) from exc
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                check=False,
                capture_output=True,
                cwd=root,
            )
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise PostgresUnavailable(f"Postgres did not accept connections on port {port}")


@contextmanager
def scratch_database(server_url: str, prefix: str = "t_") -> Iterator[str]:
    """A new, empty database on the cluster at ``server_url``, dropped (even while in use)
    on exit: one per test, so none sees another's rows."""
    import uuid

    import sqlalchemy as sa

    name = prefix + uuid.uuid4().hex[:12]
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield server_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
