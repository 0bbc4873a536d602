"""Reading an untrusted bundle within bounds: every member refused by name, type and size
before it is read, the uncompressed bytes counted (tar headers too), receipts.jsonl streamed
and hashed on the way, never spooled to disk. A gzip or tar bomb fails verification; it
never fills memory or disk.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from receipts.bundle_format import (
    DIRECTORIES,
    MANIFEST,
    MAX_MEMBERS,
    MAX_RECEIPTS_BYTES,
    MAX_SMALL_FILE,
    MAX_SMALL_TOTAL,
    MEMBER,
    RECEIPTS,
    SMALL_FILES,
    announced,
    value_count_problem,
)
from receipts.errors import VerificationError


class BundleContents:
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

    def json(self, name: str) -> Any:
        """Member `name` as JSON; missing, not JSON or with a repeated key fails the bundle."""
        if name not in self.small:
            raise VerificationError(f"bundle lacks {name}")
        try:
            return _loads(self.small[name])
        except _TooManyValues as exc:
            raise VerificationError(f"{name} {exc}") from exc
        except _DuplicateKey as exc:
            raise VerificationError(
                f"{name}: {exc} (JSON readers disagree on which counts)"
            ) from exc
        except ValueError as exc:
            raise VerificationError(f"{name} is not JSON: {exc}") from exc
        except RecursionError:
            raise VerificationError(f"{name} nests deeper than any file of a bundle") from None


class _Budget:
    """The archive's uncompressed bytes, counted: reading past `limit` fails. tarfile reads a
    PAX header whole into memory, so this is what bounds headers as well as files."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        self.raw = raw
        self.limit = limit  # grows by receipts.jsonl's size once that size is accepted
        self.count = 0
        self.data_end = 0  # where the last byte read that is not zero padding ends
        self.where = "the first tar header"

    def read(self, size: int = -1) -> bytes:
        room = self.limit - self.count + 1  # one byte more than allowed shows the overrun
        data = self.raw.read(room if size < 0 else min(size, room))
        if kept := len(data.rstrip(b"\0")):
            self.data_end = self.count + kept
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
    _check_end(tar, budget)


def _check_end(tar: tarfile.TarFile, budget: _Budget) -> None:
    """Only zeros (tar's and gzip's padding) may follow the end of the archive: tarfile stops
    there, but `tar -i` reads on and would extract the files it finds after it."""
    budget.where = "the data after the archive's end"
    while budget.read(_READ_SIZE):
        pass
    if budget.data_end > tar.offset:
        raise VerificationError(
            "the bundle holds data after its tar archive's end (tar -i would extract it as"
            " more members); a bundle ends with the archive"
        )


def _receipts_cap(small: Mapping[str, bytes]) -> int:
    """The most bytes receipts.jsonl may hold: MAX_SMALL_FILE (the longest receipt line) per
    receipt the manifest announces, when it is known; never more than MAX_RECEIPTS_BYTES."""
    try:
        count = announced(_loads(small[MANIFEST]), "receipts")
    except (KeyError, ValueError, RecursionError):
        count = None
    if count is None or count < 1:
        return MAX_RECEIPTS_BYTES
    return min(count * MAX_SMALL_FILE, MAX_RECEIPTS_BYTES)


def _walk(path: Path, small: dict[str, bytes], digests: dict[str, str]) -> Iterator[IO[bytes]]:
    """Read the bundle into `small` and `digests`, yielding receipts.jsonl's stream once (see
    BundleContents for when that takes a second pass). Reads of the stream happen outside this
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


_READ_SIZE = 1 << 20  # what is left of receipts.jsonl once its reader stopped, per read


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
        while self.read(_READ_SIZE):
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


class _TooManyValues(ValueError):
    """A JSON text too dense to parse within a verifier's memory bound."""


def _loads(data: bytes) -> Any:
    """JSON with every object's keys distinct: some readers keep a repeated key's first
    value, some its last, and two verifiers must never read two different files. A text
    that may hold more than MAX_JSON_VALUES values is refused unparsed."""
    if problem := value_count_problem(data):
        raise _TooManyValues(
            f"{problem}; no bundle file does, and parsed it would fill gigabytes of memory"
        )
    return json.loads(data, object_pairs_hook=_unique_keys)
