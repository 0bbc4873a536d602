"""Ed25519 keys: the signer that seals receipts and checkpoints, key ids, key files and the
key ring a verifier trusts (with the seq range each key signed, so rotation stays verifiable).

Keys are parsed and signatures made with cryptography (OpenSSL); signatures are verified
with libsodium through PyNaCl, which checks an Ed25519 signature in about 60% of OpenSSL's
time on this hardware, and verification is most of what an offline verifier does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from receipts.errors import ReceiptFormatError, SigningKeyError

log = logging.getLogger(__name__)

KEY_ID_PREFIX = "ed25519:"


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_for(public_key: Ed25519PublicKey) -> str:
    """ "ed25519:" + the first 32 hex digits of SHA-256 of the raw 32-byte public key."""
    return KEY_ID_PREFIX + hashlib.sha256(raw_public_bytes(public_key)).hexdigest()[:32]


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    """SubjectPublicKeyInfo PEM text, the form public keys are published and exported in."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def decode_signature(text: object) -> bytes | None:
    """The 64 signature bytes of its base64 text, or None unless the text is their one
    canonical spelling (RFC 4648 section 3.5: a decoder may accept non-zero padding bits, so
    `...g==` and `...h==` decode alike; one receipt must not have two spellings)."""
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        return None
    return raw if len(raw) == 64 and base64.b64encode(raw).decode() == text else None


def load_public_key_pem(pem: str | bytes) -> Ed25519PublicKey:
    """Parse an Ed25519 public key from PEM; SigningKeyError for anything else."""
    data = pem.encode("ascii") if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnicodeEncodeError) as exc:
        raise SigningKeyError(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"public key is {type(key).__name__}, not Ed25519")
    return key


class Signer:
    """An Ed25519 private key and its key id. Signs entry hashes and checkpoints."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id_for(self.public_key)

    @classmethod
    def generate(cls) -> Signer:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: str | bytes) -> Signer:
        """Load an unencrypted PKCS#8 PEM Ed25519 private key."""
        data = pem.encode("ascii") if isinstance(pem, str) else pem
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, UnicodeEncodeError) as exc:
            raise SigningKeyError(f"not an unencrypted PEM private key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(f"private key is {type(key).__name__}, not Ed25519")
        return cls(key)

    def private_key_pem(self) -> bytes:
        return self._private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def public_key_pem(self) -> str:
        return public_key_pem(self.public_key)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `data`."""
        return self._private_key.sign(data)

    def __repr__(self) -> str:  # never print key material
        return f"Signer(key_id={self.key_id!r})"


def load_or_create_signer(path: str | os.PathLike[str], *, create: bool = True) -> Signer:
    """The key in `path`, generated on first use (when `create`) and written with mode 0600.

    Creation is atomic (write a private temp file, then hard-link it into place), so two
    processes starting together end up with the same key instead of overwriting each other.
    """
    target = Path(path)
    if not target.exists() and not create:
        raise SigningKeyError(
            f"signing key file {target} does not exist (a key is generated only at the"
            " default place, <data_dir>/signing-key.pem)"
        )
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        signer = Signer.generate()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".signing-key-")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(signer.private_key_pem())
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, target)
            except FileExistsError:
                pass  # another process won the race: use its key
        finally:
            os.unlink(tmp)
    try:
        pem = target.read_bytes()
        mode = target.stat().st_mode
    except OSError as exc:
        raise SigningKeyError(f"cannot read signing key {target}: {exc}") from exc
    if os.name == "posix" and mode & 0o077:
        log.warning(
            "signing key %s is readable by other users (mode %o): chmod 600 it",
            target,
            mode & 0o777,
        )
    try:
        return Signer.from_pem(pem)
    except SigningKeyError as exc:  # a truncated or foreign file: say which file
        raise SigningKeyError(f"signing key file {target}: {exc}") from exc


def signer_from_env(var: str = "CALLPROOF_SIGNING_KEY") -> Signer | None:
    """The signer whose PEM private key is the text of environment variable `var`, or None
    when it is unset (the caller then falls back to a key file). Set but empty is refused: a
    secret mount that failed must not give the gateway a new signing identity."""
    if var not in os.environ:
        return None
    pem = os.environ[var].strip()
    if not pem:
        raise SigningKeyError(
            f"${var} is set but empty: give it the PEM private key, or unset it to sign with"
            " signing_key_file or <data_dir>/signing-key.pem"
        )
    try:
        return Signer.from_pem(pem)
    except SigningKeyError as exc:
        raise SigningKeyError(f"${var}: {exc}") from exc


class KeyRangeEntry(TypedDict):
    """Seqs ``first_seq..last_seq`` of ``chain`` a key signed (last_seq null: up to the head)."""

    chain: str
    first_seq: int
    last_seq: int | None


class _KeyAndRanges(TypedDict):
    key_id: str
    public_key_pem: str
    ranges: list[KeyRangeEntry]


class PublicKeyEntry(_KeyAndRanges, total=False):
    """A signing key as GET /audit/keys and a bundle's keys list it (KeyRing's input).
    `created_at`: when the key first signed in the chain listed (its first receipt or
    checkpoint there), absent for the key that has not signed it yet; in the operator's
    listing of every chain (no tenant), when the key was registered."""

    created_at: str


def superseded_key(public_keys: list[PublicKeyEntry], key_id: str) -> dict[str, str]:
    """Chains ``key_id`` signed whose newest range another key holds (it signed since, or a
    rotation handed it the chain: key_ranges.public_keys), with that key: a gateway starting on
    such a key is a stale replica or a rolled-back secret, and signing again reopens the old
    key's range (rotation docs: restart every replica on the new key)."""
    newest: dict[str, tuple[int, str]] = {}
    signed = set()
    for entry in public_keys:
        for span in entry["ranges"]:
            chain = span["chain"]
            if chain not in newest or span["first_seq"] > newest[chain][0]:
                newest[chain] = (span["first_seq"], entry["key_id"])
            if entry["key_id"] == key_id:
                signed.add(chain)
    return {c: newest[c][1] for c in sorted(signed) if newest[c][1] != key_id}


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


@dataclass(frozen=True)
class KeyRange:
    """The seqs of one chain a key signed; last_seq None means "still signing"."""

    chain: str
    first_seq: int
    last_seq: int | None = None

    def covers(self, chain: str, seq: int) -> bool:
        return (
            chain == self.chain
            and seq >= self.first_seq
            and (self.last_seq is None or seq <= self.last_seq)
        )


@dataclass
class TrustedKey:
    public_key: Ed25519PublicKey
    ranges: list[KeyRange] = field(default_factory=list)
    verify_key: VerifyKey = field(init=False)

    def __post_init__(self) -> None:
        self.verify_key = VerifyKey(raw_public_bytes(self.public_key))


class KeyRing:
    """The public keys a verifier trusts, by key id.

    A key with recorded ranges for a chain may only sign seqs inside them: a retired key that
    leaks cannot extend the chain. A key pinned with no ranges at all is trusted for any chain
    (pinning a bare key is the verifier's choice); a key whose ranges all name other chains
    signs nothing of this one (a leaked key cannot start a look-alike chain).
    """

    def __init__(self) -> None:
        self._keys: dict[str, TrustedKey] = {}

    def add(self, public_key: Ed25519PublicKey, ranges: Iterable[KeyRange] = ()) -> str:
        """Trust `public_key` (merging ranges if already present); returns its key id."""
        key_id = key_id_for(public_key)
        entry = self._keys.setdefault(key_id, TrustedKey(public_key))
        entry.ranges.extend(r for r in ranges if r not in entry.ranges)
        return key_id

    def add_pem(self, pem: str | bytes, ranges: Iterable[KeyRange] = ()) -> str:
        return self.add(load_public_key_pem(pem), ranges)

    def unranged(self) -> list[str]:
        """The ids of keys trusted with no seq range at all (for any seq of any chain)."""
        return [key_id for key_id, key in self._keys.items() if not key.ranges]

    @classmethod
    def from_public_keys(cls, entries: Iterable[Mapping[str, Any]]) -> KeyRing:
        """Build from `[{"key_id", "public_key_pem", "ranges": [{"chain", "first_seq",
        "last_seq"}]}]` (the shape of ledger.public_keys() and a bundle's keys.json plus PEMs).
        A stated key_id that does not match the key is an error, never silently trusted."""
        ring = cls()
        for entry in entries:
            try:
                ranges = [
                    KeyRange(str(r["chain"]), int(r["first_seq"]), _opt_int(r.get("last_seq")))
                    for r in entry.get("ranges", ())
                ]
                pem = entry["public_key_pem"]
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ReceiptFormatError(f"malformed public key entry: {exc!r}") from exc
            key_id = ring.add_pem(pem, ranges)
            if entry.get("key_id", key_id) != key_id:
                raise SigningKeyError(
                    f"key id {entry['key_id']!r} does not match its public key ({key_id})"
                )
        return ring

    def to_public_keys(self) -> list[PublicKeyEntry]:
        return [
            {
                "key_id": key_id,
                "public_key_pem": public_key_pem(entry.public_key),
                "ranges": [
                    {"chain": r.chain, "first_seq": r.first_seq, "last_seq": r.last_seq}
                    for r in entry.ranges
                ],
            }
            for key_id, entry in self._keys.items()
        ]

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def key_ids(self) -> list[str]:
        return list(self._keys)

    def allows(self, key_id: str, chain: str, seq: int) -> bool:
        """Known key, and seq inside its recorded ranges for the chain (if it has any)."""
        own = self._ranges_on(key_id, chain)
        return own is not None and (not own or any(r.covers(chain, seq) for r in own))

    def allows_checkpoint(self, key_id: str, chain: str, tree_size: int) -> bool:
        """Whether the key may sign the chain's checkpoint at ``tree_size``: unless all its
        turns on the chain ended before that size. A retired key that leaks cannot sign a
        later size, which would cut the chain's tail off; a key whose turn came later (one
        rotated in signs the head it took over) may sign an earlier size."""
        own = self._ranges_on(key_id, chain)
        return own is not None and (
            not own or any(r.last_seq is None or r.last_seq >= tree_size for r in own)
        )

    def _ranges_on(self, key_id: str, chain: str) -> list[KeyRange] | None:
        """The key's ranges on ``chain`` ([] for a key pinned with none at all), or None when
        it may sign nothing there (unknown, or ranged on other chains only)."""
        entry = self._keys.get(key_id)
        if entry is None:
            return None
        own = [r for r in entry.ranges if r.chain == chain]
        return own if own or not entry.ranges else None

    def verify(self, key_id: str, data: bytes, signature: bytes) -> bool:
        """True when `signature` is a valid Ed25519 signature of `data` by a trusted key."""
        entry = self._keys.get(key_id)
        if entry is None:
            return False
        try:
            entry.verify_key.verify(data, signature)
        except (BadSignatureError, ValueError):  # ValueError: not 64 bytes
            return False
        return True
