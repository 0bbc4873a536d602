"""compose.yaml holds the production shape: Postgres, vLLM on a GPU, a one-shot migration and
the gateway, started in dependency order with health checks. No Docker engine runs on this
machine (nor in CI), so the file is checked as data: what `docker compose` would act on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return test if isinstance(test, str) else " ".join(test)


def test_the_four_services_exist(services: dict[str, Any]) -> None:
    assert set(services) == {"postgres", "vllm", "migrate", "gateway"}


def test_postgres_keeps_its_data_in_a_volume_and_reports_ready(services: dict[str, Any]) -> None:
    pg = services["postgres"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])
    assert "pg_isready" in healthcheck_text(pg)


def test_vllm_runs_a_real_model_on_a_gpu_with_structured_outputs(services: dict[str, Any]) -> None:
    vllm = services["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    args = dict(a.removeprefix("--").split("=", 1) for a in vllm["command"] if "=" in a)
    assert "/" in args["model"]  # a hub model id, e.g. Qwen/Qwen2.5-7B-Instruct
    structured = json.loads(args["structured-outputs-config"])
    assert structured == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert "--enable-auto-tool-choice" in vllm["command"] and "tool-call-parser" in args
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    assert "/health" in healthcheck_text(vllm)
    assert "ports" not in vllm  # reachable only through the gateway


def test_migrate_runs_once_after_postgres_is_healthy(services: dict[str, Any]) -> None:
    migrate = services["migrate"]
    assert migrate["command"] == ["ledger", "migrate"]  # alembic upgrade head
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert migrate.get("restart") == "no"
    assert migrate["environment"]["CALLPROOF_DB"].startswith("postgresql+psycopg://")


def test_gateway_waits_for_the_three_and_serves_vllm(services: dict[str, Any]) -> None:
    gateway = services["gateway"]
    assert gateway["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
        "vllm": {"condition": "service_healthy"},
    }
    env = gateway["environment"]
    assert env["CALLPROOF_ENGINE"] == "vllm" and env["CALLPROOF_VLLM_URL"] == "http://vllm:8000"
    served = next(a for a in services["vllm"]["command"] if a.startswith("--served-model-name="))
    assert env["CALLPROOF_MODEL"] == served.split("=", 1)[1]
    assert env["CALLPROOF_DB"] == services["migrate"]["environment"]["CALLPROOF_DB"]
    assert gateway["ports"] == ["127.0.0.1:8000:8000"]  # plaintext: for the TLS proxy only
    assert gateway["stop_grace_period"] == "120s"
    assert "/readyz" in healthcheck_text(gateway)


def test_signing_key_comes_from_a_mounted_secret(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    gateway = services["gateway"]
    assert gateway["secrets"] == ["signing_key"]
    assert gateway["environment"]["CALLPROOF_SIGNING_KEY_FILE"] == "/run/secrets/signing_key"
    assert "file" in compose["secrets"]["signing_key"]
    assert "CALLPROOF_SIGNING_KEY" not in gateway["environment"]  # never inline key material


def test_gateway_image_builds_from_the_root_dockerfile(services: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert services["gateway"]["build"] == services["migrate"]["build"] == "."
    assert 'ENTRYPOINT ["callproof"]' in dockerfile
    # the image serves in front of vLLM: no embedded engine (torch) in it
    assert "torch==" not in dockerfile
    # at the versions the suite passed with (scripts/lock.sh)
    assert 'pip install -c constraints.txt ".[gateway,postgres]"' in dockerfile
    assert re.search(r"^COPY .*\bconstraints\.txt\b.* \./$", dockerfile, re.MULTILINE)
    assert services["gateway"]["environment"]["CALLPROOF_ENGINE"] == "vllm"


def test_the_gateway_binds_the_weights_vllm_serves(services: dict[str, Any]) -> None:
    """Without a weights digest every manifest has weights_digest null and a replay compares
    null with null: the gateway reads the pinned snapshot vLLM serves from its cache volume."""
    vllm, gateway = services["vllm"], services["gateway"]
    args = dict(a.removeprefix("--").split("=", 1) for a in vllm["command"] if "=" in a)
    assert re.fullmatch(r"[0-9a-f]{40}", args["revision"])  # a commit, not a moving branch
    [cache] = [v.split(":") for v in vllm["volumes"] if v.startswith("hf-cache:")]
    assert cache[1] == "/root/.cache/huggingface"  # where vllm-openai's hub cache lives
    [mount] = [v.split(":") for v in gateway["volumes"] if v.startswith("hf-cache:")]
    assert mount[2] == "ro"  # the gateway never writes the weights
    repo = "models--" + args["model"].replace("/", "--")
    snapshot = f"{mount[1]}/hub/{repo}/snapshots/{args['revision']}"
    assert gateway["environment"]["CALLPROOF_VLLM_MODEL_DIR"] == snapshot
    assert "CALLPROOF_WEIGHTS_DIGEST" not in gateway["environment"]  # computed, not typed in


def test_the_weights_digests_outlive_a_recreated_gateway(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    """The digests' cache was under $HOME/.cache in the container's own layer: a rotation's
    `up -d --force-recreate` hashed the served weights (15 GB) again on every replica."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    cache = re.search(r"CALLPROOF_MODEL_CACHE=(\S+)", dockerfile).group(1)
    [mount] = [v.split(":") for v in services["gateway"]["volumes"] if v.endswith(f":{cache}")]
    assert mount[0] in compose["volumes"]  # a named volume, not the container's layer
    assert re.search(rf"chown callproof [^\n]*{cache}\b", dockerfile)  # writable by the user


def test_the_build_context_leaves_out_keys_ledgers_and_environments() -> None:
    """`docker compose build` sends the context to the builder: the data directory holds the
    signing key and the ledger, the virtual environments gigabytes."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".venv-vllm", "data", "secrets"} <= set(ignored)
