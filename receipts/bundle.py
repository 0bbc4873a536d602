"""Export bundles and their offline verifier: a .tar.gz that proves a run of one chain's
receipts with nothing but the file itself (and, ideally, the operator's public key).

Layout (docs/receipt-format.md has the precise rules):

    bundle-manifest.json   format, version, chain, seq range, SHA-256 of every other file
    checkpoint.json        a signed checkpoint whose tree covers the last receipt
    proofs.json            first seq, previous entry hash, compact ranges left and right
    keys.json              key ids with the seq ranges they signed; keys/<id>.pem the keys
    schemas/<hash>.json    every bound schema, canonical JSON, named by its SHA-256
    receipts.jsonl         one receipt per line (canonical JSON), in seq order

Verification is checks of single receipts (hash, signature, manifest, schema binding) spread
over worker processes, and the cheap sequential part (links, Merkle root) in this process.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import multiprocessing
import os
import re
import tarfile
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, NamedTuple

from receipts.canonical import canonical_json, canonical_plain, loads_plain
from receipts.chain import (
    ChainLinker,
    LinkedRun,
    ReceiptChecker,
    VerificationReport,
    link_problem,
    saved_checkpoints_note,
)
from receipts.checkpoint import check_checkpoint
from receipts.errors import (
    BundleError,
    ReceiptFormatError,
    SigningKeyError,
    VerificationError,
)
from receipts.manifest import is_hex64
from receipts.merkle import leaf_hash
from receipts.record import GENESIS_PREV_HASH, KEY_ID, Receipt
from receipts.signing import KeyRing
from receipts.trust import trusted_keys

BUNDLE_FORMAT = "callproof-bundle"
BUNDLE_VERSION = 1
MANIFEST = "bundle-manifest.json"
RECEIPTS = "receipts.jsonl"
SMALL_FILES = ("checkpoint.json", "proofs.json", "keys.json")
MEMBER = re.compile(
    r"(bundle-manifest|checkpoint|proofs|keys)\.json|receipts\.jsonl"
    r"|keys/ed25519_[0-9a-f]{32}\.pem|schemas/[0-9a-f]{64}\.json"
)
DIRECTORIES = frozenset({"", ".", "keys", "schemas"})
MAX_SMALL_FILE = 64 << 20  # metadata, schemas and receipt lines are small: refuse a bomb
MAX_SMALL_TOTAL = 256 << 20  # every member but receipts.jsonl together, tar headers included
MAX_MEMBERS = 100_000  # a few files and one schema per distinct tool set
MAX_RECEIPTS_BYTES = 64 << 30  # receipts.jsonl, whatever number of receipts is announced
BLOCK = 1 << 20  # bytes of receipts.jsonl per unit of work handed to a worker process
PARALLEL_FROM = 20_000  # below this, starting worker processes costs more than it saves

Progress = Callable[[int, int], None]
# verify_bundle turns an exception no check expected into a failed report (a traceback is no
# verdict); the test suite sets this False so that such an exception fails the test instead.
CONTAIN_UNEXPECTED = True
log = logging.getLogger(__name__)


def key_file(key_id: str) -> str:
    """keys/ed25519_<hex>.pem: the key id with ":" spelled "_" so the name extracts anywhere."""
    return "keys/" + key_id.replace(":", "_") + ".pem"


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
    """A path is opened and closed here; a caller's file object is left open."""
    if isinstance(out, (str, os.PathLike)):
        with open(out, "wb") as fh:
            yield fh
    else:
        yield out


def _add(tar: tarfile.TarFile, name: str, data: bytes | IO[bytes], size: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if isinstance(data, bytes) else size
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data) if isinstance(data, bytes) else data)


# ------------------------------------------------------------------------------- reading


class _Contents:
    """A bundle being read: every member but receipts.jsonl in memory, receipts.jsonl as a
    stream (None: the bundle has none), the members' SHA-256 once the stream is read.

    One pass when the manifest and every file it lists come before receipts.jsonl, as
    write_bundle orders them: receipts.jsonl is checked as it is decompressed, and hashed on
    the way. Any other order (a bundle unpacked and packed again) takes a second pass: the
    first reads and hashes every member, the second streams receipts.jsonl again."""

    def __init__(self, path: Path) -> None:
        self.small: dict[str, bytes] = {}
        self._digests: dict[str, str] = {}
        self._walk = _walk(path, self.small, self._digests)
        self.receipts: IO[bytes] | None = next(self._walk, None)

    def digests(self) -> dict[str, str]:
        """Every member's SHA-256, by name. Call it once receipts.jsonl is read to its end:
        the members after it are read now."""
        for _ in self._walk:
            pass
        return self._digests

    def close(self) -> None:
        self._walk.close()


class _Budget:
    """The archive's uncompressed bytes, counted: reading past `limit` fails. tarfile reads a
    PAX header whole into memory, so this is what bounds headers as well as files."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        self.raw = raw
        self.limit = limit  # grows by receipts.jsonl's size once that size is accepted
        self.count = 0
        self.where = "the first tar header"

    def read(self, size: int = -1) -> bytes:
        room = self.limit - self.count + 1  # one byte more than allowed shows the overrun
        data = self.raw.read(room if size < 0 else min(size, room))
        self.count += len(data)
        if self.count > self.limit:
            raise VerificationError(
                f"{self.where} runs past the bundle's limit: the members other than {RECEIPTS},"
                f" tar headers included, may total {MAX_SMALL_TOTAL >> 20} MiB"
            )
        return data


# what gzip and tarfile raise on a damaged archive (ValueError: a malformed GNU sparse map)
_UNREADABLE = (tarfile.TarError, EOFError, OSError, zlib.error, ValueError)


@contextmanager
def _archive(path: Path) -> Iterator[tuple[tarfile.TarFile, _Budget]]:
    """The bundle as a tar stream read through a _Budget; an unreadable one fails verification
    (the body must only read the archive, or its own errors would be blamed on the file)."""
    try:
        with gzip.open(path, "rb") as gz:
            budget = _Budget(gz, MAX_SMALL_TOTAL)
            with tarfile.open(fileobj=budget, mode="r|") as tar:
                yield tar, budget
    except _UNREADABLE as exc:
        raise VerificationError(f"not a readable .tar.gz bundle: {exc}") from exc


def _members(
    tar: tarfile.TarFile, budget: _Budget, small: Mapping[str, bytes]
) -> Iterator[tuple[str, IO[bytes]]]:
    """The bundle's files in archive order, each refused before it is read unless its name,
    type and size are a bundle's (directories are skipped). `small`, the files read so far,
    sets receipts.jsonl's limit when the manifest came first (as the writer puts it)."""
    names: set[str] = set()
    small_total = 0
    for count, member in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise VerificationError(f"the bundle has more than {MAX_MEMBERS} members")
        name = member.name.removeprefix("./")  # as `tar -C dir .` writes names
        if member.isdir() and name.rstrip("/") in DIRECTORIES:
            continue  # a bundle unpacked and packed again carries its directories
        if not member.isfile() or not MEMBER.fullmatch(name):
            raise VerificationError(f"unexpected bundle member {name!r}")
        if member.issparse():  # its holes read as zeros without costing the archive a byte
            raise VerificationError(f"bundle member {name!r} is a sparse file; none is")
        if name in names:
            raise VerificationError(f"bundle member {name!r} appears twice")
        names.add(name)
        if name == RECEIPTS:
            cap = _receipts_cap(small)
            if member.size > cap:
                raise VerificationError(
                    f"bundle member {name!r} declares {member.size} bytes, past its limit of"
                    f" {cap} ({MAX_SMALL_FILE >> 20} MiB per receipt the manifest announces,"
                    f" {MAX_RECEIPTS_BYTES >> 30} GiB at most)"
                )
            budget.limit += member.size
        elif member.size > MAX_SMALL_FILE:
            raise VerificationError(
                f"bundle member {name!r} is implausibly large (limit {MAX_SMALL_FILE >> 20} MiB)"
            )
        else:
            small_total += member.size
            if small_total > MAX_SMALL_TOTAL:
                raise VerificationError(
                    f"bundle member {name!r} takes the members other than {RECEIPTS} past"
                    f" their limit of {MAX_SMALL_TOTAL >> 20} MiB"
                )
        source = tar.extractfile(member)
        assert source is not None
        budget.where = f"bundle member {name!r}"
        yield name, source
        budget.where = f"the tar header after {name!r}"


def _receipts_cap(small: Mapping[str, bytes]) -> int:
    """The most bytes receipts.jsonl may hold: MAX_SMALL_FILE (the longest receipt line) per
    receipt the manifest announces, when it is known; never more than MAX_RECEIPTS_BYTES."""
    try:
        announced = _announced(_loads(small[MANIFEST]), "receipts")
    except (KeyError, ValueError, RecursionError):
        announced = None
    if announced is None or announced < 1:
        return MAX_RECEIPTS_BYTES
    return min(announced * MAX_SMALL_FILE, MAX_RECEIPTS_BYTES)


def _walk(path: Path, small: dict[str, bytes], digests: dict[str, str]) -> Iterator[IO[bytes]]:
    """Read the bundle into `small` and `digests`, yielding receipts.jsonl's stream once (see
    _Contents for when that takes a second pass). Reads of the stream happen outside this
    generator, so _Stream translates their errors as _archive does for the rest."""
    streamed = False
    with _archive(path) as (tar, budget):
        for name, source in _members(tar, budget, small):
            if name != RECEIPTS:
                small[name] = source.read()
                digests[name] = hashlib.sha256(small[name]).hexdigest()
                continue
            stream = _Stream(source)
            if _ready_for_receipts(small):
                yield stream
                streamed = True
            stream.read_to_end()  # a reader that stopped early still gets a full hash
            digests[name] = stream.hexdigest()
    if RECEIPTS in digests and not streamed:
        with _archive(path) as (tar, budget):
            for name, source in _members(tar, budget, small):
                if name == RECEIPTS:
                    yield _Stream(source)
                    return
        raise VerificationError(f"the bundle changed while it was read: {RECEIPTS} is gone")


def _ready_for_receipts(small: Mapping[str, bytes]) -> bool:
    """Whether the manifest, the files it lists and the files every bundle has are read."""
    try:
        listed = _loads(small[MANIFEST]).get("files")
    except (KeyError, ValueError, RecursionError, AttributeError):
        return False
    return isinstance(listed, dict) and all(
        name in small for name in (*SMALL_FILES, *listed) if name != RECEIPTS
    )


class _Stream:
    """receipts.jsonl as it is read from the archive, hashed on the way."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self._digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._source.read(size)
        except _UNREADABLE as exc:
            raise VerificationError(f"not a readable .tar.gz bundle: {exc}") from exc
        self._digest.update(data)
        return data

    def read_to_end(self) -> None:
        while self.read(BLOCK):
            pass

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


class _DuplicateKey(ValueError):
    """A JSON object repeats a key: readers disagree on which value counts."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(f"the key {key!r} appears twice in one object")
        obj[key] = value
    return obj


def _loads(data: bytes) -> Any:
    """JSON with every object's keys distinct: some readers keep a repeated key's first
    value, some its last, and two verifiers must never read two different files."""
    return json.loads(data, object_pairs_hook=_unique_keys)


def _json(contents: _Contents, name: str) -> Any:
    if name not in contents.small:
        raise VerificationError(f"bundle lacks {name}")
    try:
        return _loads(contents.small[name])
    except _DuplicateKey as exc:
        raise VerificationError(f"{name}: {exc} (JSON readers disagree on which counts)") from exc
    except ValueError as exc:
        raise VerificationError(f"{name} is not JSON: {exc}") from exc
    except RecursionError:
        raise VerificationError(f"{name} nests deeper than any file of a bundle") from None


def _announced(manifest: object, field: str) -> int | None:
    """An integer the bundle manifest announces; true is not 1 here, whatever Python says."""
    value = manifest.get(field) if isinstance(manifest, dict) else None
    return value if type(value) is int else None


class _Proofs(NamedTuple):
    first_seq: int
    prev_entry_hash: str
    left: list[bytes]
    right: list[bytes]


def _proofs(obj: Any) -> _Proofs:
    try:
        first, prev = obj["first_seq"], obj["prev_entry_hash"]
        left = [bytes.fromhex(h) for h in obj["left"]]
        right = [bytes.fromhex(h) for h in obj["right"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise VerificationError(f"proofs.json is malformed: {exc!r}") from exc
    if type(first) is not int or first < 1 or not is_hex64(prev):
        raise VerificationError("proofs.json: first_seq must be >= 1, prev_entry_hash 64 hex")
    return _Proofs(first, prev, left, right)


def _bundle_keys(contents: _Contents) -> list[dict[str, Any]]:
    """keys.json joined with the PEM files, in KeyRing.from_public_keys' shape."""
    listing = _json(contents, "keys.json")
    try:
        return [_bundle_key(contents, entry) for entry in listing["keys"]]
    except (KeyError, TypeError, UnicodeDecodeError) as exc:
        raise VerificationError(f"keys.json does not match the key files: {exc!r}") from exc


def _bundle_key(contents: _Contents, entry: Mapping[str, Any]) -> dict[str, Any]:
    key_id = entry["key_id"]
    if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
        raise VerificationError(f"keys.json: {key_id!r} is not a key id (ed25519: + 32 hex)")
    return {
        "key_id": key_id,
        "public_key_pem": contents.small[key_file(key_id)].decode("ascii"),
        "ranges": entry["ranges"],
    }


# ------------------------------------------------------------------ per-receipt checks


class CheckedBlock(NamedTuple):
    """What a worker reports on a block of lines: the run of receipts that passed and link
    among themselves, and why the receipt after that run fails (None: the block is done)."""

    run: LinkedRun
    problem: str | None


class LineChecker:
    """The self-contained checks of receipts.jsonl lines (run in workers or in-process):
    each receipt on its own, then the links between consecutive receipts of a block."""

    def __init__(self, public_keys: list[dict[str, Any]], schemas: dict[str, Any]) -> None:
        self.checker = ReceiptChecker(KeyRing.from_public_keys(public_keys), schemas)

    def check(self, block: bytes) -> CheckedBlock:
        """Check the lines of `block` in order, stopping at the first that fails."""
        first: Receipt | None = None
        last: Receipt | None = None
        leaves = []
        problem = None
        lines = block.split(b"\n")  # not splitlines: a bare \r is JSON whitespace
        if lines[-1] == b"":
            lines.pop()  # the newline that ends the block's last line
        for line in lines:
            if not line:
                problem = f"a blank line in {RECEIPTS}, where each line holds one receipt"
                break
            plain = loads_plain(line)
            try:
                obj = json.loads(line) if plain is None else plain
                receipt = Receipt.from_json_obj(obj)
                spelled = canonical_json(obj) if plain is None else canonical_plain(obj)
            except (ValueError, ReceiptFormatError) as exc:  # ValueError: not JSON
                problem = f"malformed receipt: {exc}"
                break
            except RecursionError:
                problem = "malformed receipt: it nests deeper than any receipt does"
                break
            if spelled != line:
                # JSON readers disagree on duplicate keys (Python keeps the last, others the
                # first): only the one spelling the writer uses leaves nothing to interpret.
                problem = (
                    "the receipt line is not the canonical JSON of its receipt (RFC 8785):"
                    " a duplicate key, another key order or extra whitespace"
                )
                break
            body = None if plain is None else canonical_plain(receipt.body())
            problem = self.checker.problem(receipt, body)
            if problem is None and last is not None:
                problem = link_problem(last.chain, last.seq + 1, last.entry_hash, receipt)
            if problem:
                break
            first = first or receipt
            last = receipt
            leaves.append(leaf_hash(bytes.fromhex(receipt.entry_hash)))
        if first is None or last is None:
            return CheckedBlock(LinkedRun("", 0, "", "", 0, b""), problem)
        run = LinkedRun(
            first.chain, first.seq, first.prev_hash, last.entry_hash, len(leaves), b"".join(leaves)
        )
        return CheckedBlock(run, problem)


_worker: LineChecker | None = None


def _init_worker(public_keys: list[dict[str, Any]], schemas: dict[str, Any]) -> None:
    global _worker
    _worker = LineChecker(public_keys, schemas)


def _check_in_worker(block: bytes) -> CheckedBlock:
    assert _worker is not None
    return _worker.check(block)


def _blocks(source: IO[bytes]) -> Iterator[bytes]:
    """receipts.jsonl in blocks of whole lines, about BLOCK bytes each (cut without parsing,
    so handing a block to a worker costs one bytes object)."""
    partial: list[bytes] = []  # the start of a line longer than a block, in pieces
    while data := source.read(BLOCK):
        cut = data.rfind(b"\n") + 1  # only the new data is searched: linear in the file
        if not cut:
            partial.append(data)
            if len(partial) * BLOCK > MAX_SMALL_FILE:  # a bomb, not a receipt: memory bound
                raise VerificationError(
                    f"a line of {RECEIPTS} runs past {MAX_SMALL_FILE >> 20} MiB; no receipt is"
                    " that long"
                )
            continue
        yield b"".join([*partial, data[:cut]])
        partial = [data[cut:]]
    if any(partial):
        yield b"".join(partial)


# ------------------------------------------------------------------------- verifying


def verify_bundle(
    path: str | os.PathLike[str],
    pinned: str | bytes | None = None,
    progress: Progress | None = None,
    *,
    workers: int | None = None,
    allow_range: bool = False,
    saved: Sequence[Mapping[str, Any]] = (),
    chain: str | None = None,
) -> VerificationReport:
    """Verify a bundle offline: file hashes, every signature (by a trusted key), every chain
    link, the Merkle root against the signed checkpoint and the schema binding. Reports the
    first failing seq and why. `progress(done, total)` is called as receipts are checked.
    `workers` processes check receipts (default: one per CPU for bundles of 20,000+ receipts,
    else in this process; 1 forces in-process).

    The bundle must hold the whole chain its checkpoint signs (seq 1 to tree_size) unless
    `allow_range`: proofs.json is not signed, so whoever holds a whole-chain bundle can cut
    receipts off either end and supply the compact ranges that still reach the signed root.
    A range is only what its reader asked to check; the report names it either way.

    `pinned`: the keys to trust (receipts.trust.pinned_keys); None trusts the bundle's own.

    `saved`: checkpoints the verifier kept from earlier exports; the bundle's receipts must
    pass through each one's root (the chain only grew since).

    `chain`: the chain the verifier expects; a bundle of any other (a look-alike name
    included) fails.

    Raises BundleError when `path` is not a file or `pinned` holds no usable key (and
    SigningKeyError for a PEM block that is not an Ed25519 public key); everything wrong with
    the bundle itself is a failed report.
    """
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"no bundle at {path}")
    try:
        contents = _Contents(path)
    except Exception as exc:  # noqa: BLE001 - _failed raises what is not the bundle's fault
        return _failed(exc)
    try:
        report = _verify_contents(contents, pinned, progress, workers, saved, chain)
    except VerificationError as exc:
        return VerificationReport.failed(exc.reason, seq=exc.seq)
    except Exception as exc:  # noqa: BLE001 - _failed raises what is not the bundle's fault
        return _failed(exc)
    finally:
        contents.close()
    if report.ok and not allow_range and not report.whole_chain:
        return replace(
            report,
            ok=False,
            reason=f"the bundle holds seq {report.first_seq}..{report.last_seq} of the"
            f" {report.tree_size} receipts its checkpoint signs, not the whole chain (a range"
            " export verifies only when asked for: --range)",
        )
    return report


def _failed(exc: Exception) -> VerificationReport:
    """The report for an exception out of reading or verifying a bundle. The caller's own
    input (the pinned keys) raises. An exception no check expected fails the bundle too (a
    traceback is no verdict), as a bug of callproof, with the traceback in the log."""
    if isinstance(exc, VerificationError):
        return VerificationReport.failed(exc.reason, seq=exc.seq)
    if isinstance(exc, (BundleError, SigningKeyError)) or not CONTAIN_UNEXPECTED:
        raise exc
    log.error("verifying a bundle failed unexpectedly", exc_info=exc)
    return VerificationReport.failed(
        f"the verifier cannot process this bundle ({type(exc).__name__}: {exc}); it is not"
        " verified. This is a bug in callproof: please report it with the log's traceback"
    )


def _verify_contents(
    contents: _Contents,
    pinned: str | bytes | None,
    progress: Progress | None,
    workers: int | None,
    saved: Sequence[Mapping[str, Any]],
    expected_chain: str | None,
) -> VerificationReport:
    manifest = _json(contents, MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise VerificationError(f"{MANIFEST} does not describe a {BUNDLE_FORMAT}")
    if expected_chain is not None and manifest.get("chain") != expected_chain:
        raise VerificationError(
            f"the bundle is of chain {manifest.get('chain')!a}, not {expected_chain!a}"
        )
    if type(manifest.get("v")) is not int or manifest["v"] != BUNDLE_VERSION:  # true == 1
        raise VerificationError(
            f"bundle format version {manifest.get('v')!r} is not {BUNDLE_VERSION}"
        )
    for name in SMALL_FILES:
        _json(contents, name)
    if contents.receipts is None:
        raise VerificationError(f"bundle lacks {RECEIPTS}")
    try:
        keyring, trust = trusted_keys(_bundle_keys(contents), pinned)
    except VerificationError as exc:  # the report still names the chain the manifest gives
        chain = manifest.get("chain") if isinstance(manifest.get("chain"), str) else None
        return VerificationReport.failed(exc.reason, chain=chain)
    schemas = _schemas(contents)
    proofs = _proofs(_json(contents, "proofs.json"))
    checkpoint = _json(contents, "checkpoint.json")
    if checkpoint is None:  # None would mean "no checkpoint" to the linker: no root checked
        raise VerificationError("checkpoint.json must hold the signed checkpoint, not null")
    total = manifest.get("receipts") if isinstance(manifest.get("receipts"), int) else 0
    linker = ChainLinker(
        keyring,
        chain=manifest.get("chain"),
        expected_prev_hash=proofs.prev_entry_hash,
        start_seq=proofs.first_seq,
        checkpoint=checkpoint,
        left=proofs.left,
        saved=saved,
    )
    try:
        for block in _checked(contents.receipts, keyring, schemas, total, workers):
            linker.link_run(block.run)
            if block.problem:
                raise VerificationError(block.problem, linker.next_seq)
            if progress is not None:
                progress(linker.checked, max(total, linker.checked))
        if linker.checked == 0:
            raise VerificationError(f"{RECEIPTS} holds no receipts")
        linker.finish(proofs.right)
    except VerificationError as exc:
        problem, seq = exc.reason, exc.seq
    else:
        seq = None
        span = (linker.start_seq, linker.next_seq - 1)
        problem = _manifest_problem(manifest, contents.digests())
        if not problem and span[1] > checkpoint["tree_size"]:
            problem = (
                f"seq {checkpoint['tree_size'] + 1}..{span[1]} lie past the signed checkpoint's"
                f" tree size {checkpoint['tree_size']}: no signed root covers them"
            )
        if not problem and linker.checked != total:
            problem = f"{MANIFEST} announces {total} receipts, {RECEIPTS} holds {linker.checked}"
        if not problem and (manifest.get("first_seq"), manifest.get("last_seq")) != span:
            problem = (
                f"{MANIFEST} announces seq {manifest.get('first_seq')}..{manifest.get('last_seq')},"
                f" {RECEIPTS} holds seq {span[0]}..{span[1]}"
            )
    if problem:
        return VerificationReport.failed(
            problem, seq=seq, checked=linker.checked, chain=linker.chain, notes=(trust,)
        )
    return replace(linker.report(), notes=(trust, *saved_checkpoints_note(saved)))


def _manifest_problem(manifest: Mapping[str, Any], digests: Mapping[str, str]) -> str | None:
    """What the manifest misstates, if anything, besides the receipts' seqs: a count that is
    not an integer (true is 1 to Python, not to the format), or the files and their hashes."""
    for field in ("receipts", "first_seq", "last_seq"):
        if _announced(manifest, field) is None:
            return f"{MANIFEST}: {field} must be an integer, not {manifest.get(field)!r}"
    return _file_problem(manifest, digests)


def _file_problem(manifest: Mapping[str, Any], digests: Mapping[str, str]) -> str | None:
    """Disagreement between the files present and the hashes the manifest lists, if any."""
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        return f"{MANIFEST} lists no file hashes"
    present = {name: digest for name, digest in digests.items() if name != MANIFEST}
    for name in sorted(set(listed) | set(present)):
        if name not in present:
            return f"bundle file {name} is listed in {MANIFEST} but missing"
        if name not in listed:
            return f"bundle file {name} is not listed in {MANIFEST}"
        if listed[name] != present[name]:
            return f"bundle file {name} does not match its SHA-256 in {MANIFEST}"
    return None


def _schemas(contents: _Contents) -> dict[str, Any]:
    """Every schemas/<hash>.json by its hash; one that is not JSON fails the bundle, named."""
    return {
        name[len("schemas/") : -len(".json")]: _json(contents, name)
        for name in contents.small
        if name.startswith("schemas/")
    }


def _checked(
    source: IO[bytes],
    keyring: KeyRing,
    schemas: dict[str, Any],
    total: int,
    workers: int | None,
) -> Iterator[CheckedBlock]:
    """The checked blocks of receipts.jsonl, in order; in worker processes for big bundles."""
    keys = keyring.to_public_keys()
    if workers is None:  # auto: processes pay for their start-up only on big bundles
        workers = (os.cpu_count() or 1) if total >= PARALLEL_FROM else 1
    if workers <= 1:
        checker = LineChecker(keys, schemas)
        yield from map(checker.check, _blocks(source))
        return
    # fork is fast and imports nothing again, but is only safe without other threads; a
    # threaded caller (a server) gets spawn, which needs its __main__ guarded as usual
    method = "fork" if threading.active_count() == 1 and os.name == "posix" else "spawn"
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(workers, initializer=_init_worker, initargs=(keys, schemas)) as pool:
        yield from pool.imap(_check_in_worker, _blocks(source))
