"""Export bundles, their format and their writer: a .tar.gz that proves a run of one chain's
receipts with nothing but the file itself (and, ideally, the operator's public key).

Layout (docs/receipt-format.md has the precise rules):

    bundle-manifest.json   format, version, chain, seq range, SHA-256 of every other file
    checkpoint.json        a signed checkpoint whose tree covers the last receipt
    proofs.json            first seq, previous entry hash, compact ranges left and right
    keys.json              key ids with the seq ranges they signed; keys/<id>.pem the keys
    schemas/<hash>.json    every bound schema, canonical JSON, named by its SHA-256
    receipts.jsonl         one receipt per line (canonical JSON), in seq order

receipts.bundle_archive reads a bundle within bounds; receipts.bundle_verify verifies it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

from receipts.canonical import canonical_json
from receipts.checkpoint import check_checkpoint
from receipts.errors import ReceiptFormatError
from receipts.manifest import is_hex64
from receipts.record import GENESIS_PREV_HASH, KEY_ID, Receipt

BUNDLE_FORMAT = "callproof-bundle"
BUNDLE_VERSION = 1
MANIFEST = "bundle-manifest.json"
RECEIPTS = "receipts.jsonl"
SMALL_FILES = ("checkpoint.json", "proofs.json", "keys.json")
MEMBER = re.compile(  # every name a member may have
    r"(bundle-manifest|checkpoint|proofs|keys)\.json|receipts\.jsonl"
    r"|keys/ed25519_[0-9a-f]{32}\.pem|schemas/[0-9a-f]{64}\.json"
)
DIRECTORIES = frozenset({"", ".", "keys", "schemas"})


def key_file(key_id: str) -> str:
    """keys/ed25519_<hex>.pem: the key id with ":" spelled "_" so the name extracts anywhere."""
    return "keys/" + key_id.replace(":", "_") + ".pem"


def announced(manifest: object, field: str) -> int | None:
    """An integer the bundle manifest announces; true is not 1 here, whatever Python says."""
    value = manifest.get(field) if isinstance(manifest, dict) else None
    return value if type(value) is int else None


# ------------------------------------------------------------------------------- writing


def write_bundle(
    out: str | os.PathLike[str] | IO[bytes],
    receipts: Iterable[Receipt | Mapping[str, Any]],
    schemas: Mapping[str, Mapping[str, Any]],
    public_keys: Iterable[Mapping[str, Any]],
    checkpoint: Mapping[str, Any],
    *,
    prev_entry_hash: str = GENESIS_PREV_HASH,
    proofs: Mapping[str, list[str]] | None = None,
) -> None:
    """Write a bundle of consecutive receipts of one chain to a path or binary file.

    `public_keys` is ledger.public_keys()' shape ({key_id, public_key_pem, ranges});
    `proofs` holds the hex compact ranges {"left": [...], "right": [...]} that tie a range
    (not starting at seq 1, or ending before the checkpoint) to the checkpoint's root.
    Output is deterministic: gzip and tar timestamps are zero.
    """
    check_checkpoint(checkpoint)
    with tempfile.SpooledTemporaryFile(max_size=32 << 20) as lines:
        digest, (first_seq, last_seq, chain) = _write_receipts(lines, receipts)
        if checkpoint["chain"] != chain or checkpoint["tree_size"] < last_seq:
            raise ReceiptFormatError(
                "the checkpoint must be of the same chain and cover the last receipt"
            )
        files = {
            "checkpoint.json": canonical_json(dict(checkpoint)),
            "proofs.json": canonical_json(
                {
                    "first_seq": first_seq,
                    "prev_entry_hash": prev_entry_hash,
                    "left": list((proofs or {}).get("left", [])),
                    "right": list((proofs or {}).get("right", [])),
                }
            ),
            **_key_files(public_keys),
            **_schema_files(schemas),
        }
        manifest = {
            "format": BUNDLE_FORMAT,
            "v": BUNDLE_VERSION,
            "chain": chain,
            "first_seq": first_seq,
            "last_seq": last_seq,
            "receipts": last_seq - first_seq + 1,
            "files": {
                **{name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
                RECEIPTS: digest,
            },
        }
        size = lines.seek(0, io.SEEK_END)
        lines.seek(0)
        with (
            _open_out(out) as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            # the manifest and small files first, so a reader meets them before receipts
            _add(tar, MANIFEST, canonical_json(manifest))
            for name in sorted(files):
                _add(tar, name, files[name])
            _add(tar, RECEIPTS, lines, size)


def _key_files(public_keys: Iterable[Mapping[str, Any]]) -> dict[str, bytes]:
    """keys/<id>.pem for every key, and keys.json listing ids, files and seq ranges."""
    files, listing = {}, []
    for entry in public_keys:
        key_id = entry["key_id"]
        if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
            raise ReceiptFormatError(f"not a key id: {key_id!r}")
        ranges = [
            {"chain": r["chain"], "first_seq": r["first_seq"], "last_seq": r.get("last_seq")}
            for r in entry.get("ranges", ())
        ]
        listing.append({"key_id": key_id, "file": key_file(key_id), "ranges": ranges})
        files[key_file(key_id)] = entry["public_key_pem"].encode("ascii")
    files["keys.json"] = canonical_json({"keys": listing})
    return files


def _schema_files(schemas: Mapping[str, Mapping[str, Any]]) -> dict[str, bytes]:
    """schemas/<hash>.json, written under the hash given (an edited schema shows as such)."""
    for bound in schemas:
        if not is_hex64(bound):
            raise ReceiptFormatError(f"not a schema hash: {bound!r}")
    return {f"schemas/{bound}.json": canonical_json(schema) for bound, schema in schemas.items()}


def _write_receipts(
    sink: IO[bytes], receipts: Iterable[Receipt | Mapping[str, Any]]
) -> tuple[str, tuple[int, int, str]]:
    digest = hashlib.sha256()
    first = last = None
    chain = None
    for item in receipts:
        obj = item.to_json_obj() if isinstance(item, Receipt) else item
        if first is None:
            first, chain = obj["seq"], obj["chain"]
        elif obj["seq"] != last + 1 or obj["chain"] != chain:
            raise ReceiptFormatError(
                "a bundle holds consecutive receipts of one chain, in seq order"
            )
        last = obj["seq"]
        line = canonical_json(obj) + b"\n"
        digest.update(line)
        sink.write(line)
    if first is None or chain is None or last is None:
        raise ReceiptFormatError("a bundle needs at least one receipt")
    return digest.hexdigest(), (first, last, chain)


@contextmanager
def _open_out(out: str | os.PathLike[str] | IO[bytes]) -> Iterator[IO[bytes]]:
    """A path is opened and closed here, a caller's file object left open. A file is private
    (0600, like the ledger it comes from), an existing one made so too: with retained
    payloads a bundle holds every prompt. A device (/dev/null, a pipe) is left as it is."""
    if isinstance(out, (str, os.PathLike)):
        fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
        with open(fd, "wb") as fh:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchmod(fd, 0o600)  # first: one that cannot be made private is left whole
                os.ftruncate(fd, 0)
            yield fh
    else:
        yield out


def _add(tar: tarfile.TarFile, name: str, data: bytes | IO[bytes], size: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if isinstance(data, bytes) else size
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data) if isinstance(data, bytes) else data)
