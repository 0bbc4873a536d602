"""The export bundle writer: a run of one chain's receipts written as a bundle
(receipts.bundle_format has the layout and the bounds), reading them twice so that nothing is
spooled. It refuses, before writing a byte, a bundle a reader would refuse for its size.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import itertools
import os
import stat
import tarfile
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, NamedTuple, NoReturn, TypeVar

from receipts.bundle_format import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    MANIFEST,
    MAX_MEMBERS,
    MAX_RECEIPTS_BYTES,
    MAX_SMALL_FILE,
    MAX_SMALL_TOTAL,
    RECEIPTS,
    key_file,
    value_count_problem,
)
from receipts.canonical import canonical_json
from receipts.checkpoint import check_checkpoint
from receipts.errors import BundleTooLarge, ReceiptFormatError
from receipts.manifest import is_hex64
from receipts.record import GENESIS_PREV_HASH, KEY_ID, Receipt

# A line of receipts.jsonl the writer puts in a bundle: the verifier refuses one running past
# MAX_SMALL_FILE, counting it in 1 MiB blocks (bundle_verify.BLOCK), so two are kept spare.
MAX_RECEIPT_LINE = MAX_SMALL_FILE - (2 << 20)


class ReceiptLine(NamedTuple):
    """A receipt as receipts.jsonl spells it (its canonical JSON, without the newline), with
    the chain and seq that its place in the bundle is checked by."""

    chain: str
    seq: int
    text: bytes

    @classmethod
    def of(cls, receipt: Receipt | Mapping[str, Any]) -> ReceiptLine:
        obj = receipt.to_json_obj() if isinstance(receipt, Receipt) else receipt
        return cls(obj["chain"], obj["seq"], canonical_json(obj))


BundleReceipts = Iterable[Receipt | Mapping[str, Any] | ReceiptLine]
SchemaText = Mapping[str, Any] | bytes  # a schema, or its canonical JSON already spelled
BundleSchemas = Mapping[str, Mapping[str, Any]] | Callable[[], Iterable[tuple[str, SchemaText]]]
_SchemaFiles = Generator[tuple[str, bytes], None, None]  # (schemas/<hash>.json, its bytes)
T = TypeVar("T")


def write_bundle(
    out: str | os.PathLike[str] | IO[bytes],
    receipts: BundleReceipts | Callable[[], BundleReceipts],
    schemas: BundleSchemas,
    public_keys: Iterable[Mapping[str, Any]],
    checkpoint: Mapping[str, Any],
    *,
    prev_entry_hash: str = GENESIS_PREV_HASH,
    proofs: Mapping[str, list[str]] | None = None,
) -> None:
    """Write a bundle of consecutive receipts of one chain to a path or binary file.

    The receipts are read twice: once to hash receipts.jsonl for the manifest, which comes
    first so that a verifier reads the bundle in one pass, and once to write it. Nothing is
    held or spooled, so the first bytes leave as soon as the hash is known. `receipts` is a
    collection, or a function returning the same receipts anew on each call (a database
    read); a one-shot iterator is read into a list. `schemas` is a mapping of schema hash to
    schema, or a function returning (hash, schema) pairs in hash order anew on each call, a
    schema as its canonical JSON bytes (the ledger stores them so) or as an object: they are
    read twice too, so a chain of many distinct tool sets is never held in memory.
    A second read that differs from the first is ReceiptFormatError: a file written at a
    path is then removed, a file object left unfinished. A bundle past the bounds a reader
    holds it to is BundleTooLarge, raised before anything is written.

    `public_keys` is ledger.public_keys()' shape ({key_id, public_key_pem, ranges});
    `proofs` holds the hex compact ranges {"left": [...], "right": [...]} that tie a range
    (not starting at seq 1, or ending before the checkpoint) to the checkpoint's root.
    Output is deterministic: gzip and tar timestamps are zero.
    """
    check_checkpoint(checkpoint)
    again = _rereadable(receipts)
    with contextlib.closing(_lines(again())) as lines:
        measured = _measure(lines)
    if checkpoint["chain"] != measured.chain or checkpoint["tree_size"] < measured.last_seq:
        raise ReceiptFormatError(
            "the checkpoint must be of the same chain and cover the last receipt"
        )
    room = _Room(measured)
    files = {
        "checkpoint.json": canonical_json(dict(checkpoint)),
        "proofs.json": canonical_json(
            {
                "first_seq": measured.first_seq,
                "prev_entry_hash": prev_entry_hash,
                "left": list((proofs or {}).get("left", [])),
                "right": list((proofs or {}).get("right", [])),
            }
        ),
        **_key_files(public_keys),
    }
    for name, data in files.items():
        room.take(name, data)
    schema_files = _schema_files(schemas)
    schema_digests = _measure_schemas(schema_files(), room)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    digests.update(schema_digests)
    digests[RECEIPTS] = measured.sha256
    manifest = canonical_json(
        {
            "format": BUNDLE_FORMAT,
            "v": BUNDLE_VERSION,
            "chain": measured.chain,
            "first_seq": measured.first_seq,
            "last_seq": measured.last_seq,
            "receipts": measured.last_seq - measured.first_seq + 1,
            # sorted here: msgspec sorts a map nearly in order but one key (receipts.jsonl
            # after 100,000 schemas) in quadratic time, 21 s with the GIL held
            "files": dict(sorted(digests.items())),
        }
    )
    room.take(MANIFEST, manifest)
    with (
        _open_out(out) as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        # the manifest and small files first, so a reader meets them before receipts
        _add(tar, MANIFEST, manifest)
        for name in sorted(files):  # all sort before "schemas/"
            _add(tar, name, files[name])
        with contextlib.closing(schema_files()) as again_schemas:
            for entry, first_read in itertools.zip_longest(again_schemas, schema_digests):
                if entry is None or first_read is None or _digested(*entry) != first_read:
                    raise ReceiptFormatError(
                        "the schemas changed between the bundle's two reads of them:"
                        " the bundle is unfinished and must not be used"
                    )
                _add(tar, *entry)
        with contextlib.closing(_lines(again())) as lines:  # a failure ends the read now
            second = _SecondRead(lines, measured)
            _add(tar, RECEIPTS, second, measured.size)
            second.finish()


def _rereadable(
    receipts: BundleReceipts | Callable[[], BundleReceipts],
) -> Callable[[], BundleReceipts]:
    if callable(receipts):
        return receipts
    if iter(receipts) is receipts:  # a generator or iterator: it would be empty the second time
        receipts = list(receipts)
    return lambda: receipts


@contextmanager
def _reading(items: Iterable[T]) -> Iterator[Iterator[T]]:
    """``items`` to iterate; a generator (a database read) is closed however the iteration
    ends, so its transaction ends then and not when the garbage collector gets to it."""
    source = iter(items)
    try:
        yield source
    finally:
        if isinstance(source, Generator):
            source.close()


def _lines(receipts: BundleReceipts) -> Iterator[ReceiptLine]:
    """The receipts as lines, checked to be consecutive receipts of one chain in seq order
    (the range the manifest announces)."""
    last = None
    with _reading(receipts) as source:
        for item in source:
            line = item if isinstance(item, ReceiptLine) else ReceiptLine.of(item)
            if last is not None and (line.seq != last.seq + 1 or line.chain != last.chain):
                raise ReceiptFormatError(
                    "a bundle holds consecutive receipts of one chain, in seq order"
                )
            last = line
            yield line
    if last is None:
        raise ReceiptFormatError("a bundle needs at least one receipt")


@dataclass(frozen=True)
class _Measured:
    """receipts.jsonl as the first read found it: what the manifest and tar header announce."""

    chain: str
    first_seq: int
    last_seq: int
    size: int
    sha256: str


def _measure(lines: Iterator[ReceiptLine]) -> _Measured:
    digest = hashlib.sha256()
    size = 0
    first = last = next(lines)  # _lines raises for none at all
    for last in itertools.chain([first], lines):
        if len(last.text) > MAX_RECEIPT_LINE:
            raise BundleTooLarge(
                f"receipt seq {last.seq} of chain {last.chain!r} is {len(last.text):,} bytes:"
                f" a bundle's receipt may be {MAX_RECEIPT_LINE:,} (a verifier reads it whole),"
                " so no bundle can hold it; its retained payload made it that large"
            )
        if problem := value_count_problem(last.text):
            raise BundleTooLarge(
                f"receipt seq {last.seq} of chain {last.chain!r} {problem}; a verifier parses it"
                " whole, so no bundle can hold it; its retained payload made it that large"
            )
        digest.update(last.text)
        digest.update(b"\n")
        size += len(last.text) + 1
    return _Measured(first.chain, first.seq, last.seq, size, digest.hexdigest())


class _SecondRead:
    """receipts.jsonl read again, for tarfile to copy the size the first read announced; it
    must be the same bytes (`finish` checks the hash once tarfile has copied them)."""

    def __init__(self, lines: Iterator[ReceiptLine], measured: _Measured) -> None:
        self._lines = lines
        self._measured = measured
        self._digest = hashlib.sha256()
        self._buffer = bytearray()

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            line = next(self._lines, None)
            if line is None:
                break
            self._buffer += line.text
            self._buffer += b"\n"
        if size >= 0 and len(self._buffer) < size:  # tarfile asks for no byte past the size
            self._changed()  # announced: these lines ended before it
        data = bytes(self._buffer if size < 0 else self._buffer[:size])
        del self._buffer[: len(data)]
        self._digest.update(data)
        return data

    def finish(self) -> None:
        if self.read() or self._digest.hexdigest() != self._measured.sha256:
            self._changed()

    def _changed(self) -> None:
        raise ReceiptFormatError(
            "the receipts changed between the bundle's two reads of them:"
            " the bundle is unfinished and must not be used"
        )


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


def _schema_files(schemas: BundleSchemas) -> Callable[[], _SchemaFiles]:
    """schemas/<hash>.json and its bytes in name order, anew on each call; each is written
    under the hash given (an edited schema shows as such)."""
    pairs = (
        schemas
        if callable(schemas)
        else lambda: sorted(schemas.items(), key=lambda pair: str(pair[0]))
    )

    def files() -> _SchemaFiles:
        previous = ""
        with _reading(pairs()) as source:
            for bound, schema in source:
                if not isinstance(bound, str) or not is_hex64(bound):
                    raise ReceiptFormatError(f"not a schema hash: {bound!r}")
                if bound <= previous:
                    raise ReceiptFormatError("schemas come once each, in hash order")
                previous = bound
                text = schema if isinstance(schema, bytes) else canonical_json(schema)
                yield f"schemas/{bound}.json", text

    return files


def _measure_schemas(files: _SchemaFiles, room: _Room) -> list[tuple[str, str]]:
    """(name, SHA-256) of every schema file, from the first read, each taking its ``room``
    as it is read (a range far past a bundle's bounds is refused at them, not at its end)."""
    digests = []
    with contextlib.closing(files):
        for name, data in files:
            room.take(name, data)
            digests.append(_digested(name, data))
    return digests


def _digested(name: str, data: bytes) -> tuple[str, str]:
    return name, hashlib.sha256(data).hexdigest()


def _tar_bytes(size: int) -> int:
    """What a member of ``size`` bytes takes in the tar stream: its header block and its data
    padded to whole blocks (bundle names are short: no PAX header is written for them)."""
    return tarfile.BLOCKSIZE + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


# Counted by the reader against MAX_SMALL_TOTAL besides the small files: receipts.jsonl's
# header (three blocks with the PAX header a size of 8 GiB or more needs), its padding and the
# two end-of-archive blocks (one block and two), and tarfile's read-ahead of one record.
_RESERVE = 6 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE


class _Room:
    """What a bundle's members other than receipts.jsonl take, held to the bounds a reader
    holds them to (bundle_archive) as they are counted: a bundle its verifier would refuse
    is refused before a byte is written. A shorter range of receipts binds fewer schemas."""

    def __init__(self, measured: _Measured) -> None:
        self._span = f"seqs {measured.first_seq}..{measured.last_seq} of chain {measured.chain!r}"
        self._members = 1  # receipts.jsonl
        self._bytes = _RESERVE
        if measured.size > MAX_RECEIPTS_BYTES:
            self._refuse(
                f"would hold {measured.size >> 30} GiB of receipts; a bundle may hold"
                f" {MAX_RECEIPTS_BYTES >> 30} GiB"
            )

    def take(self, name: str, data: bytes) -> None:
        """Count one more small member, ``name`` holding ``data``."""
        size = len(data)
        self._members += 1
        self._bytes += _tar_bytes(size)
        if self._members > MAX_MEMBERS:
            self._refuse(
                f"would have more than {MAX_MEMBERS} files (one per distinct schema), the"
                " most a bundle may have"
            )
        if size > MAX_SMALL_FILE:
            self._refuse(
                f"would hold a file of {size} bytes; a bundle's files other than {RECEIPTS}"
                f" may be {MAX_SMALL_FILE >> 20} MiB each"
            )
        if problem := value_count_problem(data):
            self._refuse(f"would hold {name}, which {problem}; a verifier parses each file whole")
        if self._bytes > MAX_SMALL_TOTAL:
            self._refuse(
                f"would hold more than {MAX_SMALL_TOTAL >> 20} MiB of files other than"
                f" {RECEIPTS} (its schemas, keys and proofs, tar headers included), the most"
                " a bundle may hold: a verifier reads them into memory"
            )

    def _refuse(self, why: str) -> NoReturn:
        raise BundleTooLarge(f"a bundle of {self._span} {why}: export a shorter range of receipts")


@contextmanager
def _open_out(out: str | os.PathLike[str] | IO[bytes]) -> Iterator[IO[bytes]]:
    """A path is opened and closed here, a caller's file object left open. A file is private
    (0600, like the ledger it comes from), an existing one made so too: with retained
    payloads a bundle holds every prompt. A device (/dev/null, a pipe) is left as it is. A
    file an error left unfinished is removed (not through a symbolic link)."""
    if isinstance(out, (str, os.PathLike)):
        fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
        with open(fd, "wb") as fh:
            opened = os.fstat(fd)
            if stat.S_ISREG(opened.st_mode):
                os.fchmod(fd, 0o600)  # first: one that cannot be made private is left whole
                os.ftruncate(fd, 0)
            try:
                yield fh
            except BaseException:
                _remove_unfinished(out, opened)
                raise
    else:
        yield out


def _remove_unfinished(path: str | os.PathLike[str], opened: os.stat_result) -> None:
    """An unfinished bundle is no bundle: the regular file written is removed, if the name
    still names it itself (not through a symbolic link, not a file put there since)."""
    with contextlib.suppress(OSError):
        now = os.stat(path, follow_symlinks=False)
        if stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == (
            opened.st_dev,
            opened.st_ino,
        ):
            os.unlink(path)


def _add(tar: tarfile.TarFile, name: str, data: bytes | _SecondRead, size: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if isinstance(data, bytes) else size
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data) if isinstance(data, bytes) else data)
