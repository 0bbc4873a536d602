"""Ed25519 keys: key ids, key files (0600, race-safe first run), env keys, rotation ranges."""

from __future__ import annotations

import hashlib
import multiprocessing
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from receipts.errors import SigningKeyError
from receipts.signing import (
    KeyRange,
    KeyRing,
    Signer,
    key_id_for,
    load_or_create_signer,
    raw_public_bytes,
    signer_from_env,
)


def test_key_id_is_truncated_sha256_of_raw_public_key() -> None:
    signer = Signer.generate()
    raw = raw_public_bytes(signer.public_key)
    assert len(raw) == 32
    assert signer.key_id == "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]
    assert key_id_for(signer.public_key) == signer.key_id


def test_signature_verifies_only_for_its_key_and_data() -> None:
    signer, other = Signer.generate(), Signer.generate()
    ring = KeyRing()
    ring.add(signer.public_key)
    sig = signer.sign(b"\x01" * 32)
    assert ring.verify(signer.key_id, b"\x01" * 32, sig)
    assert not ring.verify(signer.key_id, b"\x02" * 32, sig)
    assert not ring.verify(other.key_id, b"\x01" * 32, other.sign(b"\x01" * 32))  # unknown


def test_key_file_is_created_0600_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "signing.pem"
    first = load_or_create_signer(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_signer(path).key_id == first.key_id
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind


_start: Any = None  # a worker's copy of the barrier its first run waits at


def _line_up(barrier: Any) -> None:
    global _start
    _start = barrier


def _key_id_of(path: str) -> str:
    _start.wait(30)  # all four first runs start together
    return load_or_create_signer(path).key_id


def test_concurrent_first_runs_agree_on_one_key(tmp_path: Path) -> None:
    path = str(tmp_path / "signing.pem")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    with context.Pool(4, initializer=_line_up, initargs=(barrier,)) as pool:
        ids = pool.map(_key_id_of, [path] * 4, chunksize=1)
    assert len(set(ids)) == 1


def test_bad_key_material_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    with pytest.raises(SigningKeyError):
        load_or_create_signer(bad)
    monkeypatch.setenv("CALLPROOF_SIGNING_KEY", "not a key")
    with pytest.raises(SigningKeyError, match="CALLPROOF_SIGNING_KEY"):
        signer_from_env()
    for empty in ("", " \n"):  # a secret mount that failed: not the key file's key instead
        monkeypatch.setenv("CALLPROOF_SIGNING_KEY", empty)
        with pytest.raises(SigningKeyError, match=r"\$CALLPROOF_SIGNING_KEY is set but empty"):
            signer_from_env()
    with pytest.raises(SigningKeyError):
        KeyRing().add_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")


def test_signer_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CALLPROOF_SIGNING_KEY", raising=False)
    assert signer_from_env() is None
    signer = Signer(Ed25519PrivateKey.generate())
    monkeypatch.setenv("CALLPROOF_SIGNING_KEY", signer.private_key_pem().decode())
    loaded = signer_from_env()
    assert loaded is not None and loaded.key_id == signer.key_id
    assert "PRIVATE" not in repr(loaded)


def test_rotation_ranges_bound_what_a_key_may_sign() -> None:
    old, new = Signer.generate(), Signer.generate()
    ring = KeyRing()
    ring.add(old.public_key, [KeyRange("acme", 1, 100)])
    ring.add(new.public_key, [KeyRange("acme", 101, None)])
    assert ring.allows(old.key_id, "acme", 100)
    assert not ring.allows(old.key_id, "acme", 101)  # a leaked retired key cannot extend
    assert ring.allows(new.key_id, "acme", 10_000)
    assert not ring.allows(new.key_id, "acme", 100)
    assert not ring.allows(old.key_id, "globex", 5)  # ranged on acme only: not globex's key
    bare = KeyRing()
    bare.add(old.public_key)  # pinned with no ranges: the verifier's choice, for any chain
    assert bare.allows(old.key_id, "globex", 5)


def test_keyring_round_trips_through_public_key_dicts() -> None:
    signer = Signer.generate()
    ring = KeyRing()
    ring.add(signer.public_key, [KeyRange("acme", 1, 7)])
    again = KeyRing.from_public_keys(ring.to_public_keys())
    assert again.key_ids() == [signer.key_id]
    assert not again.allows(signer.key_id, "acme", 8)
    forged = ring.to_public_keys()
    forged[0]["key_id"] = "ed25519:" + "0" * 32
    with pytest.raises(SigningKeyError, match="does not match"):
        KeyRing.from_public_keys(forged)


def test_a_key_file_others_can_read_is_loaded_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "signing-key.pem"
    created = load_or_create_signer(path)
    assert not caplog.records  # created 0600: nothing to say
    path.chmod(0o644)
    assert load_or_create_signer(path).key_id == created.key_id
    assert "readable by other users (mode 644)" in caplog.text
