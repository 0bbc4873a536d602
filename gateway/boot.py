"""Starting a gateway: the data directory, migrations, signing key, admin key, engine, ledger.

The embedded default needs no configuration: everything it needs is created on first run
under the data directory (SQLite ledger, 0600 signing key) and an admin key is printed once.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.apikeys import KeyStore
from gateway.settings import Settings, SettingsError
from receipts.errors import KeyAlreadyListed, SigningKeyError
from receipts.first_key import first_signing_key
from receipts.ledger import Ledger
from receipts.ledger_file import check_sqlite_file, sqlite_file
from receipts.signing import Signer, load_or_create_signer, signer_from_env
from runtime.engines.base import Engine
from runtime.urls import hide_password

log = logging.getLogger("callproof.gateway")


@dataclass
class Resources:
    """What an app runs on; whoever opens them closes them (`aclose`)."""

    engine: Engine
    ledger: Ledger
    keys: KeyStore

    async def aclose(self) -> None:
        self.ledger.close()
        self.keys.close()
        await self.engine.aclose()


class PortInUse(OSError):
    """Another process listens on the gateway's port: the machine's state, not a setting."""


def listening_socket(settings: Settings) -> socket.socket:
    """The gateway's socket, bound before anything is created or loaded: a port in use must
    not cost a first-run admin key printed for a gateway that never serves, nor a model load."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        return socket.create_server((settings.host, settings.port), family=family)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {settings.port} on {settings.host} is in use") from None
        raise SettingsError(
            f"cannot listen on port {settings.port} on {settings.host} (settings 'host',"
            f" 'port'): {exc.strerror or exc}"
        ) from None


def check_engine_inputs(settings: Settings) -> None:
    """An embedded --model that is not a model, or a CALLPROOF_BACKENDS naming no backend
    it can use, stops the start before anything is created (each left a data directory, a
    ledger and a generated key behind); only the model files' shapes are read here, the
    weights load later."""
    if settings.engine != "embedded":
        return
    from runtime.backends.registry import backend_order

    backend_order()
    if settings.model is not None:
        from runtime.engines.embedded import resolve_model

        resolve_model(settings.model)


def prepare_database(settings: Settings) -> None:
    """Bring the database schema up to date (idempotent); a SQLite ledger file is created
    first, 0600 (SQLite gives its -wal and -shm files the same mode), the default one inside
    the private data directory. With `--db` pointing at Postgres the data directory is not
    touched here: `callproof keys --db postgresql+psycopg://...` needs none."""
    from migrations.runner import upgrade

    ledger_file = sqlite_file(settings.db_url)
    setting = "db" if settings.db else "data_dir"
    if ledger_file is not None:
        if settings.db is None:
            _private_data_dir(settings)
        check_sqlite_file(ledger_file)
        _create_private_file(ledger_file, setting)
        _warn_if_shared(ledger_file)
    upgrade(settings.db_url)
    if ledger_file is not None:
        _check_writable(settings.db_url, ledger_file, setting)


def _create_private_file(path: Path, setting: str) -> None:
    """``path`` created 0600 if it is not there; failing that, which setting to fix and how
    (an errno alone, "No such file or directory", names neither)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_RDONLY, 0o600))
    except OSError as exc:
        fix = (
            f"give this user write access to {path.parent}"
            if path.parent.is_dir()
            else f"create the directory {path.parent}, or name a file in one that exists"
        )
        raise SettingsError(
            f"setting {setting!r}: cannot create the SQLite ledger {path}: {exc.strerror} ({fix})"
        ) from None


def _check_writable(url: str, path: Path, setting: str) -> None:
    """A SQLite file this user cannot write (a restore of mode 0400 or of another owner, a
    read-only mount) opens read-only, migrates nothing when it is up to date, and reads
    well: /readyz said ready while every receipt failed at its commit with a 503. One
    write that changes nothing tells before the gateway listens."""
    import sqlalchemy as sa

    from receipts.store import short_error

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")
    except sa.exc.OperationalError as exc:
        raise SettingsError(
            f"setting {setting!r}: the SQLite ledger {path} cannot be written"
            f" ({short_error(exc)}): give this user write access to it, to its directory and"
            " to the -wal and -shm files beside it"
        ) from None
    finally:
        engine.dispose()


DatabaseState = Literal["absent", "unmigrated", "behind", "ready", "newer"]


def database_state(url: str) -> tuple[DatabaseState, str | None]:
    """Whether the database a command would only read is there and set up, and at which
    revision: "behind" is an older revision of this release's (a later table missing),
    "newer" one it does not know (a newer release migrated it). Found without creating it
    (looking must not make an empty SQLite file); one that does not answer raises
    SQLAlchemyError, a SQLite file that is no database NotALedgerFile."""
    from migrations.runner import current, known_revisions

    ledger_file = sqlite_file(url)
    if ledger_file is not None:
        if not ledger_file.exists():
            return "absent", None
        check_sqlite_file(ledger_file)
    revision = current(url)
    revisions = known_revisions()
    if revision is None:
        return "unmigrated", None
    if revision not in revisions:
        return "newer", revision
    return ("ready" if revision == revisions[-1] else "behind"), revision


def newer_database(url: str, revision: str | None) -> str:
    """The message for a database a newer callproof migrated: this release may misread it."""
    return (
        f"the database at {hide_password(url)} is at revision {revision!r}, which this callproof"
        " release does not know (a newer release migrated it): use that release"
    )


def say_ledger(url: str) -> None:
    """Which database a command uses, on stderr: a typo in the settings that name it
    otherwise shows only as an empty ledger, or a new one under ./data."""
    print(f"callproof: ledger at {hide_password(url)}", file=sys.stderr, flush=True)


def named_signer(settings: Settings) -> Signer | None:
    """CALLPROOF_SIGNING_KEY (PEM text) when set, else the signing_key_file the settings name,
    which is never generated: a missing one (a secret mount that failed) must stop the
    gateway, not give it a new signing identity. None: the default key file, default_signer's.
    It needs no database, so a start it refuses has created nothing."""
    from_env = signer_from_env()
    if from_env is not None:
        if settings.signing_key_file is not None:  # two keys named: say which one signs
            log.warning(
                "CALLPROOF_SIGNING_KEY is set, so signing_key_file %s is ignored",
                settings.signing_key_file,
            )
        return from_env
    if settings.signing_key_file is None:
        return None
    return load_or_create_signer(settings.signing_key_file, create=False)


def default_signer(settings: Settings) -> Signer:
    """The default key file, <data_dir>/signing-key.pem (after prepare_database), generated
    on first run only, as the ledger's first key: one gone from a ledger that lists a key (a
    data directory not mounted, a restore without its key), or a replica with a data
    directory of its own beside another that made the ledger's key, must stop the gateway,
    not give it a second identity."""
    _private_data_dir(settings)
    path = settings.signing_key_path
    if path.exists():
        return load_or_create_signer(path, create=False)
    try:
        return first_signing_key(settings.db_url, lambda: load_or_create_signer(path, create=True))
    except KeyAlreadyListed as exc:
        if path.exists():  # made meanwhile by another gateway on this data directory
            signer = load_or_create_signer(path, create=False)
            if signer.key_id in exc.key_ids:
                return signer
        raise SigningKeyError(
            f"no signing key at {path} and none named, but the ledger at"
            f" {hide_password(settings.db_url)} already lists {', '.join(exc.key_ids)}: restore"
            " that key file, or name the key the ledger's gateways share in signing_key_file"
            " or CALLPROOF_SIGNING_KEY (replicas all sign with one key; to rotate to a new key"
            " on purpose, make one with `openssl genpkey -algorithm ed25519 -out FILE` and"
            " name it; docs/deploy.md, key rotation)"
        ) from None


def _private_data_dir(settings: Settings) -> Path:
    """The data directory, created 0700: it holds receipts, key hashes, the signing key and,
    with retain_payloads, the messages."""
    try:
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way ("File exists"), no permission
        raise SettingsError(
            f"setting 'data_dir': cannot create the directory {settings.data_dir}:"
            f" {exc.strerror} (name a directory, or a path where one can be created)"
        ) from None
    _warn_if_shared(settings.data_dir)
    return settings.data_dir


def _warn_if_shared(path: Path) -> None:
    """Made by an earlier version, or by hand: say so, change nothing."""
    mode = path.stat().st_mode & 0o777
    if os.name == "posix" and mode & 0o077:
        log.warning("%s is open to other users (mode %o): chmod go-rwx it", path, mode)


class AdminKeyNotShown(Exception):
    """The first run's admin key could not be shown (stdout's reader had gone, or stdout is
    closed or failed), so it was not made: kept unseen, it would be the only admin key there
    is, and no later start offers another. ``reader_gone``: a broken pipe, which the CLI
    exits 141 for (else 2)."""

    def __init__(self, message: str, *, reader_gone: bool) -> None:
        super().__init__(message)
        self.reader_gone = reader_gone


def first_run_admin_key(keys: KeyStore, show: Callable[[str], None]) -> bool:
    """On first run (no admin key has ever existed) create one, its secret given to ``show``
    before it is committed, and return True; else False. Not when every admin key was
    revoked: then whoever can restart the service (or read its stdout) would get a fresh
    admin key; an operator makes one with the CLI."""
    if keys.has_admin(active=False):
        return False
    try:
        keys.create("admin", "admin", name="first-run admin", show=show)
    except OSError as exc:  # a closed pipe, a full disk: what ``show`` writes to failed
        raise AdminKeyNotShown(
            f"the first-run admin key could not be shown on stdout ({exc.strerror or exc}),"
            " so none was made: the next start makes one and shows it",
            reader_gone=isinstance(exc, BrokenPipeError),
        ) from None
    return True


def load_engine(settings: Settings) -> Engine:
    if settings.engine == "vllm":
        from runtime.engines.vllm import VllmEngine

        assert settings.vllm_url and settings.model  # load_settings refuses vllm without them
        if settings.weights_digest is None and settings.vllm_model_dir is None:
            # said at start: manifests would otherwise hold weights_digest null, unnoticed,
            # and a replay compare null with null
            log.warning(
                "receipts will not bind the served weights (weights_digest null in every"
                " manifest): set vllm_model_dir (CALLPROOF_VLLM_MODEL_DIR) to a read-only copy"
                " of the served model directory, or weights_digest (CALLPROOF_WEIGHTS_DIGEST);"
                " docs/deploy.md, manifest identity",
                extra={"event": "weights_unbound"},
            )
        return VllmEngine(
            settings.vllm_url,
            settings.model,
            api_key=settings.vllm_api_key,
            weights_digest=settings.weights_digest,
            model_dir=settings.vllm_model_dir,
            backend=settings.vllm_backend,
            think_budget=settings.vllm_think_budget,
            request_timeout=settings.vllm_timeout_s,
        )
    from runtime.engines.embedded import EmbeddedEngine

    return EmbeddedEngine.load(settings.model, limits=settings.limits)


def open_resources(settings: Settings, engine: Engine, signer: Signer) -> Resources:
    ledger = Ledger(
        settings.db_url,
        signer,
        checkpoint_every=settings.checkpoint_every,
        checkpoint_interval_s=settings.checkpoint_interval_s,
        retain_payloads=settings.retain_payloads,
    )
    ledger.start()
    return Resources(engine=engine, ledger=ledger, keys=KeyStore.open(settings.db_url))
