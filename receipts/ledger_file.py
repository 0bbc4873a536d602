"""The SQLite ledger's file: where a database URL puts it, whether the path still names the
file the ledger opened, and a consistent copy of it (`callproof ledger backup`).

A SQLite connection keeps writing to the file it opened even after that file is removed or
replaced (a cleanup script, a restore copied over it): every commit then succeeds into an
unlinked inode that no restart, auditor or backup will ever read, and the gateway would hand
out tool calls whose receipts are already lost; and the next new connection would create an
empty file there. The writer checks before it uses its connection, and every read before it
takes one, so that case fails closed instead.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from receipts.errors import LedgerUnavailable, NotALedgerFile, OverwritesLedger


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None for Postgres and in-memory SQLite), also in the URI
    form (``sqlite:///file:ledger.db?uri=true``)."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or database in (None, "", ":memory:"):
        return None
    if parsed.query.get("uri") == "true" and database.startswith("file:"):
        uri = urlsplit(database)
        if parsed.query.get("mode") == "memory" or uri.path in ("", ":memory:"):
            return None
        return Path(uri.path)
    return Path(database)


# The first 16 bytes of every SQLite database file (its file format, section 1.3).
SQLITE_HEADER = b"SQLite format 3\x00"


def check_sqlite_file(path: Path) -> None:
    """NotALedgerFile when ``path`` is a directory, or holds bytes that are no SQLite database
    (an empty file is one not written yet): SQLite's "file is not a database" came as an
    unavailable database, exit 3, which scripts retry, and named no file; a directory was
    "Is a directory (give this user write access ...)". One this user cannot read is left to
    SQLite's open, whose failure says what to fix."""
    try:
        if path.is_dir():
            raise NotALedgerFile(
                f"{path} is a directory, not a SQLite database file: move it away, or name"
                " the ledger's file (setting 'db', sqlite:///PATH)"
            )
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except (FileNotFoundError, PermissionError):
        return
    if head and head != SQLITE_HEADER:
        raise NotALedgerFile(
            f"{path} is not a SQLite database (it does not start with SQLite's header): restore"
            " the ledger from a backup, or name the right file"
        )


class LedgerFile:
    """The identity (device, inode) of the SQLite file at `path` when first checked; later
    checks raise LedgerUnavailable once the path is gone or names another file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity = self._current()

    def check(self) -> None:
        """Raise LedgerUnavailable unless `path` still names the file first seen there."""
        current = self._current()
        if self._identity is None:  # created since (a ledger opened before its migration)
            self._identity = current
        elif current != self._identity:
            what = "was removed" if current is None else "was replaced by another file"
            raise LedgerUnavailable(
                f"the SQLite ledger {self.path} {what} while open: its receipts would go"
                " where no restart finds them; restore the file and restart the gateway"
            )

    def _current(self) -> tuple[int, int] | None:
        """(device, inode) of the file at `path`, None if there is none; a path that cannot
        be looked at (its directory made unreadable, a stale network mount) fails closed."""
        try:
            stat = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise LedgerUnavailable(
                f"the SQLite ledger {self.path} cannot be looked at: {exc.strerror}"
            ) from None
        return stat.st_dev, stat.st_ino


def refuse_ledger_output(path: Path, dest: Path) -> None:
    """OverwritesLedger when ``dest`` is the SQLite ledger at ``path`` or one of its -wal and
    -shm files, by name or as the same file (a hard or symbolic link): `ledger backup -o`
    the live file replaced it, and the gateway using it answered 503 until a restart."""
    for own in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        same = dest.resolve() == own.resolve()
        if not same and dest.exists() and own.exists():
            same = os.path.samefile(dest, own)
        if same:
            raise OverwritesLedger(
                f"{dest} is the ledger's own file {own}: writing it would replace the database"
                " under the gateways using it; write to another file"
            )


def backup(path: Path, dest: Path) -> None:
    """A consistent copy of the SQLite ledger at ``path`` in ``dest`` (mode 0600, written in
    full or not at all), taken while gateways write to it. SQLite's online backup copies one
    snapshot, receipts still in the ``-wal`` file included: a copy of the ledger file alone
    misses every receipt committed since the last WAL checkpoint."""
    refuse_ledger_output(path, dest)
    partial = dest.with_name(f".{dest.name}.partial")
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    os.chmod(partial, 0o600)  # one left by an earlier run keeps its mode through O_CREAT
    try:
        source, target = sqlite3.connect(path), sqlite3.connect(partial)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
