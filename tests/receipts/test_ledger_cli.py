"""`callproof export`, `callproof verify`, `callproof ledger verify|migrate`: exit codes,
human and --json reports, against a real database and real bundles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from ledger_kit import at_seq, attacker, body_of, fill, ledger, migrated

from callproof.cli import main
from receipts.record import Receipt
from receipts.signing import Signer
from receipts.store import receipt_text


@pytest.fixture
def filled(db_url: str, tmp_path: Path) -> tuple[str, Signer, Path]:
    assert main(["ledger", "migrate", "--db", db_url]) == 0
    signer = Signer.generate()
    with ledger(db_url, signer) as led:
        fill(led, 40)
        fill(led, 5, tenant="globex")
    key = tmp_path / "signing.pem"
    key.write_bytes(signer.private_key_pem())
    return db_url, signer, key


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_export_then_verify(filled, tmp_path: Path, capsys) -> None:
    url, signer, key = filled
    bundle = tmp_path / "acme.tar.gz"
    code, out, _ = run(capsys, "export", "--db", url, "--tenant", "acme", "-o", str(bundle),
                       "--signing-key", str(key))  # fmt: skip
    assert code == 0 and bundle.is_file() and "acme" in out

    pem = tmp_path / "operator.pem"
    pem.write_text(signer.public_key_pem())
    code, out, _ = run(capsys, "verify", str(bundle), "--public-key", str(pem), "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["checked"] == 40 and report["tree_size"] == 40

    code, out, _ = run(capsys, "verify", str(bundle))
    assert code == 0 and out.startswith("OK: chain 'acme', 40 receipts verified")
    assert f", Merkle root at tree size 40: {report['root_hash']}\n" in out  # as --json has it

    other = tmp_path / "other.pem"
    other.write_text(Signer.generate().public_key_pem())
    code, out, _ = run(capsys, "verify", str(bundle), "--public-key", str(other), "--json")
    report = json.loads(out)
    assert code == 1 and report["first_failure_seq"] == 1 and "unknown key" in report["reason"]

    code, out, _ = run(capsys, "verify", str(bundle), "--chain", "acm")  # it said chain '?'
    assert (code, out) == (1, "FAILED: the bundle is of chain 'acme', not 'acm'\n")


def test_an_exported_bundle_is_private_as_the_ledger_is(filled, tmp_path: Path, capsys) -> None:
    """It was written 0644 (the umask) beside a 0600 ledger in a 0700 directory, while with
    retain_payloads it holds every prompt; a bundle written over is made private too."""
    import os

    url, _, key = filled
    fresh, old = tmp_path / "fresh.tar.gz", tmp_path / "old.tar.gz"
    old.write_bytes(b"an earlier export")
    old.chmod(0o644)
    umask = os.umask(0o022)
    try:
        for bundle in (fresh, old):
            code, _, err = run(capsys, "export", "--db", url, "--tenant", "acme", "-o",
                               str(bundle), "--signing-key", str(key))  # fmt: skip
            assert code == 0, err
            assert bundle.stat().st_mode & 0o777 == 0o600, oct(bundle.stat().st_mode)
    finally:
        os.umask(umask)


def test_a_later_bundle_is_checked_against_a_checkpoint_saved_earlier(
    filled, tmp_path: Path, capsys
) -> None:
    url, signer, key = filled
    with ledger(url, signer) as led:
        saved = led.checkpoint_now("acme")  # what an auditor kept at 40 receipts
        fill(led, 5)
    (tmp_path / "saved.json").write_text(json.dumps(saved))
    bundle = tmp_path / "later.tar.gz"
    argv = ["export", "--db", url, "--tenant", "acme", "-o", str(bundle), "--signing-key", str(key)]
    assert run(capsys, *argv)[0] == 0
    code, out, _ = run(capsys, "verify", str(bundle), "--checkpoint", str(tmp_path / "saved.json"))
    assert code == 0 and "45 receipts verified" in out
    (tmp_path / "forged.json").write_text(json.dumps({**saved, "root_hash": "0" * 64}))
    code, out, _ = run(
        capsys, "verify", str(bundle), "--json", "--checkpoint", str(tmp_path / "forged.json")
    )
    report = json.loads(out)
    assert code == 1 and "saved checkpoint" in report["reason"]  # its signature no longer holds


def test_export_does_not_sign_with_a_key_a_rotation_retired(
    filled, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotation named the new key to serve alone (docs/deploy.md); the scheduled export
    still found the old key file and signed a checkpoint with it past its turn, which an
    auditor holding the rotation's key list refused. It now ends at the stored checkpoint."""
    url, old, key = filled
    monkeypatch.setenv("CALLPROOF_SIGNING_KEY_FILE", str(key))
    bundle = tmp_path / "scheduled.tar.gz"
    with ledger(url, Signer.generate(), checkpoint_every=1000, checkpoint_interval_s=3600) as led:
        fill(led, 3)  # seqs 41-43, signed by the new key, no checkpoint yet
        code, _, err = run(capsys, "export", "--db", url, "--tenant", "acme", "-o", str(bundle))
        assert code == 0 and f"not signing with {old.key_id}" in err
        (old_key,) = [k for k in led.public_keys("acme") if k["key_id"] == old.key_id]
    assert old_key["ranges"] == [{"chain": "acme", "first_seq": 1, "last_seq": 40}]
    code, out, _ = run(capsys, "verify", str(bundle), "--json")
    assert code == 0 and json.loads(out)["tree_size"] == 40  # the closing checkpoint of 40


def test_ledger_backup_copies_what_the_wal_holds_while_a_writer_runs(
    db_url: str, tmp_path: Path, capsys
) -> None:
    """A copy of ledger.db alone took 7 of 13 committed receipts (the rest were in -wal) and
    verified as an intact, shorter chain. The backup holds every committed receipt, is
    private, and a Postgres ledger is pointed at pg_dump."""
    backup = tmp_path / "backups" / "ledger.db"
    backup.parent.mkdir()
    assert run(capsys, "ledger", "migrate", "--db", db_url)[0] == 0
    if not db_url.startswith("sqlite"):
        code, _, err = run(capsys, "ledger", "backup", "--db", db_url, "-o", str(backup))
        assert code == 2 and "pg_dump" in err and not backup.exists()
        return
    with ledger(db_url) as led:
        fill(led, 13)
        code, out, err = run(capsys, "ledger", "backup", "--db", db_url, "-o", str(backup))
        assert code == 0 and out == f"wrote {backup}\n", err
    assert backup.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in backup.parent.iterdir()] == ["ledger.db"]  # no partial file left
    code, out, _ = run(capsys, "ledger", "verify", "--db", f"sqlite:///{backup}", "--json")
    (report,) = json.loads(out) if out.startswith("[") else [json.loads(out)]
    assert code == 0 and report["checked"] == 13, out


def test_backup_and_export_refuse_to_write_over_the_ledger_itself(
    fresh_sqlite_url: str, tmp_path: Path, capsys
) -> None:
    """`ledger backup -o data/ledger.db` replaced the live file (a running gateway then
    answered 503 until restarted) and `export -o` it truncated the ledger to a bundle: the
    ledger's file, its -wal and -shm, by any name (a hard or symbolic link), are refused."""
    import os

    db = Path(fresh_sqlite_url.removeprefix("sqlite:///"))
    assert run(capsys, "ledger", "migrate", "--db", fresh_sqlite_url)[0] == 0
    hard, soft = tmp_path / "hard.db", tmp_path / "soft.db"
    os.link(db, hard)
    soft.symlink_to(db)
    with ledger(fresh_sqlite_url) as led:
        fill(led, 3)
        inode = db.stat().st_ino
        for target in (db, hard, soft, Path(f"{db}-wal"), tmp_path / "." / db.name):
            for command in (["ledger", "backup"], ["export", "--tenant", "acme"]):
                argv = [*command, "--db", fresh_sqlite_url, "-o", str(target)]
                code, out, err = run(capsys, *argv)
                assert code == 2 and "is the ledger's own file" in err and not out, (argv, err)
        assert db.stat().st_ino == inode
        fill(led, 1)  # the gateway's ledger still writes
    code, out, _ = run(capsys, "ledger", "verify", "--db", fresh_sqlite_url, "--json")
    assert code == 0 and json.loads(out)["checked"] == 4, out


def test_export_names_a_signing_key_file_that_holds_no_key(filled, tmp_path: Path, capsys) -> None:
    url, _, _ = filled
    garbage = tmp_path / "half.pem"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\nMC4CAQAw\n")
    argv = ["export", "--db", url, "--tenant", "acme", "-o", str(tmp_path / "b.tgz")]
    code, _, err = run(capsys, *argv, "--signing-key", str(garbage))
    assert code == 2 and f"signing key file {garbage}:" in err, err


def test_export_refuses_an_empty_signing_key_variable(
    filled, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As serve does: it signed with the default key file instead, as if none were named."""
    url, _, _ = filled
    monkeypatch.setenv("CALLPROOF_SIGNING_KEY", "")
    argv = ["export", "--db", url, "--tenant", "acme", "-o", str(tmp_path / "b.tgz")]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "$CALLPROOF_SIGNING_KEY is set but empty" in err, err


def test_export_of_a_time_range(filled, tmp_path: Path, capsys) -> None:
    url, _, key = filled
    with ledger(url) as led:
        fill(led, 1, tenant="acme")  # a receipt newer than the range
        first = at_seq(led, "acme", 10).created_at
        until = at_seq(led, "acme", 30).created_at
    bundle = tmp_path / "range.tar.gz"
    until = until.replace("T", "t").replace("Z", "+00:00")  # RFC 3339 5.6 allows "t"
    argv = ["export", "--db", url, "--tenant", "acme", "--from", first, "--to", until]
    assert run(capsys, *argv, "-o", str(bundle), "--signing-key", str(key))[0] == 0
    code, out, _ = run(capsys, "verify", str(bundle), "--json")
    assert code == 1 and "not the whole chain" in json.loads(out)["reason"]
    code, out, _ = run(capsys, "verify", str(bundle), "--range", "--json")
    report = json.loads(out)
    assert code == 0 and report["checked"] == 20
    assert (report["first_seq"], report["last_seq"]) == (10, 29)
    assert report["tree_size"] > 29  # tied to a later checkpoint by the right compact range
    code, out, _ = run(capsys, "verify", str(bundle), "--range")
    assert f"seq 10..29 of tree size {report['tree_size']}" in out


def test_export_refuses_a_time_it_would_have_to_guess(filled, tmp_path: Path, capsys) -> None:
    """--from and --to read times as GET /audit/export does: RFC 3339 with its offset (a
    time without one was taken as UTC: an operator elsewhere got another window than meant),
    refused as a usage error before any database is opened, and in order."""
    url, _, key = filled
    bundle = tmp_path / "guessed.tar.gz"
    for flag, guessed, says in (
        ("--from", "2026-11-23 23:45:50", "not an RFC 3339 time with its offset"),
        ("--from", "2026-11-23T23:45:50", "not an RFC 3339 time with its offset"),
        ("--from", "20261123T234550Z", "not an RFC 3339 time with its offset"),
        ("--from", "2026-11-23", "not an RFC 3339 time with its offset"),
        ("--to", "2026-11-23T23:45:50+05:99", "not an RFC 3339 time with its offset"),
        ("--to", "2026-02-30T00:00:00Z", "day is out of range for month"),
    ):
        argv = ["export", "--db", url, "--tenant", "acme", flag, guessed, "-o", str(bundle)]
        with pytest.raises(SystemExit) as exited:
            run(capsys, *argv, "--signing-key", str(key))
        err = capsys.readouterr().err
        assert exited.value.code == 2 and says in err, (guessed, err)
        assert not bundle.exists()
    backwards = ["--from", "2026-11-23T10:00:00Z", "--to", "2026-11-23T09:00:00Z"]
    argv = ["export", "--db", url, "--tenant", "acme", *backwards, "-o", str(bundle)]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "--from must not be after --to" in err and not bundle.exists()


def test_export_needs_a_tenant_when_there_are_several(filled, tmp_path: Path, capsys) -> None:
    url, _, _ = filled
    code, _, err = run(capsys, "export", "--db", url, "-o", str(tmp_path / "x.tar.gz"))
    assert code == 2 and "--tenant" in err and "acme, globex" in err


def test_tampered_bundle_fails_with_the_seq(filled, tmp_path: Path, capsys) -> None:
    url, _, _ = filled
    with attacker(url) as conn:
        obj = body_of(conn, "acme", 17)
        obj["usage"]["completion_tokens"] += 1
        conn.execute(
            sa.text("UPDATE receipts SET body = :b WHERE chain = 'acme' AND seq = 17"),
            {"b": receipt_text(Receipt.from_json_obj(obj))},
        )
    code, out, _ = run(capsys, "ledger", "verify", "--db", url)
    assert code == 1
    assert "FAILED: chain 'acme' at seq 17: entry_hash does not match" in out
    assert "OK: chain 'globex', 5 receipts verified" in out

    bundle = tmp_path / "tampered.tar.gz"
    assert run(capsys, "export", "--db", url, "--tenant", "acme", "-o", str(bundle))[0] == 0
    # the console script, as an auditor runs it: a separate process, no database
    done = subprocess.run(
        [sys.executable, "-m", "callproof", "verify", str(bundle)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "FAILED: chain 'acme' at seq 17" in done.stdout


def test_verify_whose_reader_has_gone_stops_quietly(fresh_sqlite_url: str, tmp_path: Path) -> None:
    """`callproof verify B | head -1` ended in a BrokenPipeError traceback and exit 1, which
    says the bundle failed: now nothing more is said and the exit is 141, as a shell
    reports a command that SIGPIPE stopped."""
    import os

    bundle = tmp_path / "b.tar.gz"
    with ledger(migrated(fresh_sqlite_url), Signer.generate()) as led:
        fill(led, 3)
        led.export("acme", bundle)
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "callproof", "verify", str(bundle)],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_ledger_verify_json_and_ranges(filled, tmp_path: Path, capsys) -> None:
    url, signer, _ = filled
    code, out, _ = run(capsys, "ledger", "verify", "--db", url, "--tenant", "acme",
                       "--from-seq", "5", "--to-seq", "25", "--json")  # fmt: skip
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["checked"] == 21
    # globex holds 5 receipts and acme 40: a range names one chain's seqs
    code, _, err = run(capsys, "ledger", "verify", "--db", url, "--to-seq", "25")
    assert code == 2 and "a seq range is of one chain: give --tenant too" in err
    code, _, err = run(capsys, "ledger", "verify", "--db", url, "--tenant", "globex",
                       "--to-seq", "25")  # fmt: skip
    assert code == 2 and "chain 'globex' ends at seq 5: seq 25 is beyond its head" in err
    pem = tmp_path / "operator.pem"
    pem.write_text(signer.public_key_pem())
    code, out, _ = run(capsys, "ledger", "verify", "--db", url, "--tenant", "acme",
                       "--public-key", str(pem), "--json")  # fmt: skip
    (note,) = json.loads(out)["notes"]
    assert code == 0 and "a PEM file pins no seq ranges, so ed25519:" in note
    code, out, _ = run(capsys, "ledger", "verify", "--db", url, "--json")
    both = json.loads(out)
    assert code == 0 and both["ok"] and [c["chain"] for c in both["chains"]] == ["acme", "globex"]

    with ledger(url, signer) as led:
        saved = led.checkpoint_now("acme")
    with attacker(url) as conn:  # the tail and every stored checkpoint go
        for table in ("receipts", "receipt_calls"):  # index rows too: a careful attacker
            conn.execute(sa.text(f"DELETE FROM {table} WHERE chain = 'acme' AND seq > 35"))
        conn.execute(sa.text("DELETE FROM checkpoints WHERE chain = 'acme'"))
        tip = body_of(conn, "acme", 35)["entry_hash"]
        conn.execute(
            sa.text(
                "UPDATE chains SET head_seq = 35, head_hash = :h, checkpoint_size = 0"
                " WHERE chain = 'acme'"
            ),
            {"h": tip},
        )
    saved_file = tmp_path / "checkpoint.json"
    saved_file.write_text(json.dumps(saved))
    argv = ["ledger", "verify", "--db", url, "--tenant", "acme", "--json"]
    assert run(capsys, *argv)[0] == 0  # nothing left in the database to notice
    code, out, _ = run(capsys, *argv, "--checkpoint", str(saved_file))
    report = json.loads(out)
    assert code == 1 and report["first_failure_seq"] == 36 and "truncated" in report["reason"]


def test_bad_input_and_unavailable_database(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "verify", str(tmp_path / "missing.tar.gz"))
    assert code == 2 and "no bundle" in err
    not_a_bundle = tmp_path / "junk.tar.gz"
    not_a_bundle.write_bytes(b"not gzip")  # not an archive at all: bad input
    code, out, err = run(capsys, "verify", str(not_a_bundle), "--json")
    assert code == 2 and "is not an export bundle" in err
    assert json.loads(out) == {"ok": False, "error": err.strip().removeprefix("callproof: ")}
    not_a_bundle.write_bytes(b"\x1f\x8bdamaged")  # an archive that does not read: failed
    code, out, _ = run(capsys, "verify", str(not_a_bundle), "--json")
    assert code == 1 and "not a readable" in json.loads(out)["reason"]
    down = "postgresql+psycopg://nobody@127.0.0.1:9/none"
    code, _, err = run(capsys, "ledger", "verify", "--db", down)
    assert code == 3 and "unavailable" in err
    code, _, err = run(capsys, "ledger", "migrate", "--db", down)  # SQLAlchemy's three lines
    named, said = err.splitlines()  # the ledger named first, then one line
    assert (
        code == 3 and named == "callproof: ledger at postgresql+psycopg://nobody@127.0.0.1:9/none"
    )
    assert said.startswith("callproof: the database is unavailable: OperationalError: ")
    monkeypatch.delenv("CALLPROOF_DB", raising=False)
    empty = tmp_path / "empty"  # serve's default ledger, <data_dir>/ledger.db, is not there
    code, _, err = run(capsys, "ledger", "verify", "--data-dir", str(empty))
    assert code == 2 and f"no ledger at {empty / 'ledger.db'}" in err
    assert not empty.exists()
    (tmp_path / "bare.db").touch()  # a database nobody migrated: a step missed, not an outage
    code, _, err = run(capsys, "ledger", "verify", "--db", f"sqlite:///{tmp_path / 'bare.db'}")
    assert code == 2 and "no ledger tables" in err and "ledger migrate" in err
    monkeypatch.setenv("CALLPROOF_DB", down)  # the variable serve reads works here too
    code, _, err = run(capsys, "ledger", "verify")
    assert code == 3 and "unavailable" in err


def test_bad_input_with_json_is_a_json_object_still_exit_2_or_3(
    filled, tmp_path: Path, capsys
) -> None:
    """--json printed a report only when one was made: bad input left stdout plain (empty)
    for the program reading it. It is now {"ok": false, "error"}, the exit code unchanged."""
    url, _, key = filled
    bundle = tmp_path / "acme.tar.gz"
    assert run(capsys, "export", "--db", url, "--tenant", "acme", "-o", str(bundle),
               "--signing-key", str(key))[0] == 0  # fmt: skip
    junk = tmp_path / "junk.json"
    junk.write_text('{"not": "a checkpoint"}')
    down = "postgresql+psycopg://nobody@127.0.0.1:9/none"
    for argv, code, says in [
        (["verify", str(tmp_path / "missing.tar.gz")], 2, "no bundle"),
        (["verify", str(bundle), "--checkpoint", str(junk)], 2, "is not a checkpoint"),
        (["verify", str(bundle), "--public-key", str(junk)], 2, "no PEM public key"),
        (["ledger", "verify", "--db", url, "--checkpoint", str(junk)], 2, "is not a checkpoint"),
        (["ledger", "verify", "--db", down], 3, "unavailable"),
    ]:
        exited, out, err = run(capsys, *argv, "--json")
        report = json.loads(out)
        assert exited == code and report == {"ok": False, "error": report["error"]}, argv
        assert says in report["error"] and report["error"] in err, argv


def test_the_ledger_commands_find_the_ledger_serve_made(tmp_path: Path, capsys) -> None:
    """After the README's first run (`serve` with no flags: SQLite under the data directory)
    export and verify need no --db, as `keys` needs none."""
    data = tmp_path / "data"
    assert run(capsys, "ledger", "migrate", "--data-dir", str(data))[0] == 0
    assert (data / "ledger.db").stat().st_mode & 0o777 == 0o600
    signer = Signer.generate()
    with ledger(f"sqlite:///{data / 'ledger.db'}", signer) as led:
        fill(led, 3)
    (tmp_path / "settings.toml").write_text(f'data_dir = "{data}"\n')
    code, out, err = run(capsys, "ledger", "verify", "--config", str(tmp_path / "settings.toml"))
    assert code == 0 and "3 receipts verified" in out, err
    url = f"sqlite:///{data / 'ledger.db'}"
    with ledger(url, signer, checkpoint_every=1000, checkpoint_interval_s=3600) as led:
        fill(led, 2)
    with attacker(url) as conn:  # receipts past the last checkpoint, as between two of them
        conn.execute(sa.text("DELETE FROM checkpoints WHERE tree_size > 3"))
    (data / "signing-key.pem").write_bytes(signer.private_key_pem())  # serve's key file
    bundle = tmp_path / "b.tar.gz"
    code, _, err = run(capsys, "export", "--data-dir", str(data), "-o", str(bundle))
    assert code == 0, err
    code, out, _ = run(capsys, "verify", str(bundle))  # signed at the head with serve's key
    assert code == 0 and "5 receipts verified, Merkle root at tree size 5" in out
