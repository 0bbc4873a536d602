"""The offline verifier of export bundles (receipts.bundle_format has the format): file hashes,
every signature by a trusted key, every chain link, the Merkle root against the signed
checkpoint, the schema binding; the first failing seq and why.

The checks of single receipts (hash, signature, manifest, schema binding) are spread over
worker processes; the cheap sequential part (links, Merkle root) runs in this process.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import IO, Any, NamedTuple

from receipts.bundle_archive import BundleContents
from receipts.bundle_format import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    MANIFEST,
    MAX_SMALL_FILE,
    RECEIPTS,
    SMALL_FILES,
    announced,
    key_file,
    value_count_problem,
)
from receipts.canonical import canonical_json, canonical_plain, loads_plain
from receipts.chain import (
    ChainLinker,
    LinkedRun,
    ReceiptChecker,
    VerificationReport,
    link_problem,
    saved_checkpoints_note,
)
from receipts.errors import (
    CanonicalizationError,
    ReceiptFormatError,
    SigningKeyError,
    VerificationError,
    VerifierInputError,
)
from receipts.manifest import is_hex64
from receipts.merkle import leaf_hash
from receipts.record import KEY_ID, Receipt
from receipts.signing import KeyRing, load_public_key_pem, public_key_pem
from receipts.trust import trusted_keys

BLOCK = 1 << 20  # bytes of receipts.jsonl per unit of work handed to a worker process
PARALLEL_FROM = 20_000  # below this, starting worker processes costs more than it saves

Progress = Callable[[int, int], None]
# verify_bundle turns an exception no check expected into a failed report (a traceback is no
# verdict); the test suite sets this False so that such an exception fails the test instead.
CONTAIN_UNEXPECTED = True
log = logging.getLogger(__name__)


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

    Raises VerifierInputError when `path` is not a file or `pinned` holds no usable key (and
    SigningKeyError for a PEM block that is not an Ed25519 public key); everything wrong with
    the bundle itself is a failed report.
    """
    path = Path(path)
    if not path.is_file():
        raise VerifierInputError(f"no bundle at {path}")
    try:
        contents = BundleContents(path)
    except Exception as exc:  # noqa: BLE001 - _failed raises what is not the bundle's fault
        return _failed(exc)
    try:
        report = _verify_contents(contents, pinned, progress, workers, saved, chain)
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
    if isinstance(exc, (VerifierInputError, SigningKeyError)) or not CONTAIN_UNEXPECTED:
        raise exc
    log.error("verifying a bundle failed unexpectedly", exc_info=exc)
    return VerificationReport.failed(
        f"the verifier cannot process this bundle ({type(exc).__name__}: {exc}); it is not"
        " verified. This is a bug in callproof: please report it with the log's traceback"
    )


def _verify_contents(
    contents: BundleContents,
    pinned: str | bytes | None,
    progress: Progress | None,
    workers: int | None,
    saved: Sequence[Mapping[str, Any]],
    expected_chain: str | None,
) -> VerificationReport:
    manifest = _manifest(contents, expected_chain)
    if contents.receipts is None:
        raise VerificationError(f"bundle lacks {RECEIPTS}")
    try:
        keyring, trust = trusted_keys(_bundle_keys(contents), pinned)
    except VerificationError as exc:  # the report still names the chain the manifest gives
        chain = manifest.get("chain") if isinstance(manifest.get("chain"), str) else None
        return VerificationReport.failed(exc.reason, chain=chain)
    schemas = _schemas(contents)
    proofs = _proofs(contents.json("proofs.json"))
    checkpoint = contents.json("checkpoint.json")
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
    blocks = _checked(contents.receipts, keyring, schemas, total, workers)
    bound: set[str | None] = set()
    ids = _IdChecks(whole=proofs.first_seq == 1)
    try:
        for block in blocks:
            linker.link_run(block.run)
            bound |= block.schemas
            for offset, receipt_ids in enumerate(block.ids):
                if problem := ids.problem(receipt_ids):
                    seq = block.run.seq + offset
                    linker.checked = seq - linker.start_seq  # not the rest of its run
                    raise VerificationError(problem, seq)
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
        problem = (
            _manifest_problem(manifest, contents.digests())
            or _extent_problem(manifest, checkpoint, linker, total)
            or _unbound_problem(schemas, bound)
        )
    finally:
        blocks.close()  # a walk that stopped early stops its workers now, not at collection
    if problem:
        return VerificationReport.failed(
            problem, seq=seq, checked=linker.checked, chain=linker.chain, notes=(trust,)
        )
    notes = (trust, *ids.notes(proofs.first_seq), *saved_checkpoints_note(saved))
    return replace(linker.report(), notes=notes)


class _IdChecks:
    """Ids across a bundle's receipts: each receipt id and issued call id once, and each link
    to a receipt of the bundle naming an earlier one that issued that call. A link to a
    receipt before a range bundle's first seq cannot be checked; `whole`: there is none."""

    def __init__(self, *, whole: bool) -> None:
        self.whole = whole
        self.receipts: set[str] = set()
        self.issuer: dict[str, str] = {}  # call id -> the receipt that issued it
        self.before: set[str] = set()  # receipts linked to but not seen: before the range
        self.unchecked = 0  # links to them

    def problem(self, ids: ReceiptIds) -> str | None:
        """Why the next receipt's ids fail, or None (then they are recorded)."""
        receipt_id, calls, links = ids
        if receipt_id in self.receipts:
            return f"receipt id {receipt_id} appears twice"
        if receipt_id in self.before:
            return f"receipt {receipt_id} is linked to by an earlier receipt"
        for call_id, linked in links:
            issuer = self.issuer.get(call_id)
            if linked is None or issuer == linked:
                continue
            said = f"a link names {linked} as the issuer of tool call {call_id!a}"
            if issuer is not None:
                return f"{said}, which {issuer} issued"
            if linked in self.receipts:
                return f"{said}, which it did not issue"
            if self.whole:
                return f"{said}, and no earlier receipt is {linked}"
            self.before.add(linked)  # so it may neither appear later nor issue the call again
            self.issuer[call_id] = linked
            self.unchecked += 1
        for call_id in calls:
            if call_id in self.issuer:
                return f"tool call id {call_id} was issued before, by {self.issuer[call_id]}"
            self.issuer[call_id] = receipt_id
        self.receipts.add(receipt_id)
        return None

    def notes(self, first_seq: int) -> tuple[str, ...]:
        """What a passing report says of the links it could not check, if any."""
        if not self.unchecked:
            return ()
        note = f"{self.unchecked} link(s) name receipts before seq {first_seq}, outside the bundle"
        return (note + ": not checked",)


def _manifest(contents: BundleContents, expected_chain: str | None) -> dict[str, Any]:
    """The bundle's manifest, once it names this format and version (and the chain asked
    for), and every small file it must hold is there and parses."""
    manifest = contents.json(MANIFEST)
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
        contents.json(name)
    return manifest


def _extent_problem(
    manifest: Mapping[str, Any], checkpoint: Mapping[str, Any], linker: ChainLinker, total: int
) -> str | None:
    """What the checkpoint or the manifest misstates about the receipts linked, if anything:
    a seq no signed root covers, or a count or seq range the file does not hold."""
    first, last = linker.start_seq, linker.next_seq - 1
    if last > checkpoint["tree_size"]:
        return (
            f"seq {checkpoint['tree_size'] + 1}..{last} lie past the signed checkpoint's"
            f" tree size {checkpoint['tree_size']}: no signed root covers them"
        )
    if linker.checked != total:
        return f"{MANIFEST} announces {total} receipts, {RECEIPTS} holds {linker.checked}"
    if (manifest.get("first_seq"), manifest.get("last_seq")) != (first, last):
        return (
            f"{MANIFEST} announces seq {manifest.get('first_seq')}..{manifest.get('last_seq')},"
            f" {RECEIPTS} holds seq {first}..{last}"
        )
    return None


def _manifest_problem(manifest: Mapping[str, Any], digests: Mapping[str, str]) -> str | None:
    """What the manifest misstates, if anything, besides the receipts' seqs: a count that is
    not an integer (true is 1 to Python, not to the format), or the files and their hashes."""
    for field in ("receipts", "first_seq", "last_seq"):
        if announced(manifest, field) is None:
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


def _schemas(contents: BundleContents) -> dict[str, bytes]:
    """Every schemas/<hash>.json by its hash, as the bundle's bytes, each the canonical JSON
    of its schema (the one spelling, as receipt lines are): each is parsed here, so one that
    is not fails the bundle, named, but only the bytes are kept (parsed, a bundle of distinct
    large tool sets held them all); the checks parse one when a receipt binds it
    (SchemaBinding remembers the most recent, bounded)."""
    schemas = {}
    for name, data in contents.small.items():
        if name.startswith("schemas/"):
            try:
                canonical = canonical_json(contents.json(name)) == data
            except CanonicalizationError:
                canonical = False
            if not canonical:
                raise VerificationError(f"{name} is not the canonical JSON (RFC 8785) of a schema")
            schemas[name[len("schemas/") : -len(".json")]] = data
    return schemas


def _unbound_problem(schemas: Iterable[str], bound: set[str | None]) -> str | None:
    """A schema no receipt binds, if any: a bundle holds exactly the schemas its receipts
    bind (one under a hash that is not its own binds none)."""
    unbound = sorted(set(schemas) - bound)
    return (
        f"bundle member 'schemas/{unbound[0]}.json' is a schema no receipt binds"
        if unbound
        else None
    )


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


def _bundle_keys(contents: BundleContents) -> list[dict[str, Any]]:
    """keys.json joined with the PEM files, in KeyRing.from_public_keys' shape. Every key file
    must be listed: an unlisted one is a file no verifier examined, handed on as evidence."""
    listing = contents.json("keys.json")
    try:
        keys = [_bundle_key(contents, entry) for entry in listing["keys"]]
    except (KeyError, TypeError, UnicodeDecodeError) as exc:
        raise VerificationError(f"keys.json does not match the key files: {exc!r}") from exc
    listed: set[str] = set()
    for key in keys:  # keys.json of a bundle lists each key once; a repeat merges ranges
        if key_file(key["key_id"]) in listed:
            raise VerificationError(f"keys.json lists {key['key_id']} twice")
        listed.add(key_file(key["key_id"]))
    for name in contents.small:
        if name.startswith("keys/") and name not in listed:
            raise VerificationError(f"bundle member {name!r} is a key keys.json does not list")
    return keys


def _bundle_key(contents: BundleContents, entry: Mapping[str, Any]) -> dict[str, Any]:
    key_id = entry["key_id"]
    if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
        raise VerificationError(f"keys.json: {key_id!r} is not a key id (ed25519: + 32 hex)")
    name = key_file(key_id)
    if entry["file"] != name:
        raise VerificationError(f"keys.json names {entry['file']!r} as {key_id}'s file, not {name}")
    pem = contents.small[name].decode("ascii")
    try:
        spelled = public_key_pem(load_public_key_pem(pem))
    except SigningKeyError as exc:
        raise VerificationError(f"bundle keys: {name}: {exc}") from exc
    if pem != spelled:  # a second key, or text besides the key, that some reader would take
        raise VerificationError(f"bundle keys: {name} holds more than its one public key")
    return {"key_id": key_id, "public_key_pem": pem, "ranges": entry["ranges"]}


# ------------------------------------------------ per-receipt checks, in worker processes


class CheckedBlock(NamedTuple):
    """What a worker reports on a block of lines: the run of receipts that passed and link
    among themselves, and why the receipt after that run fails (None: the block is done)."""

    run: LinkedRun
    problem: str | None
    schemas: frozenset[str | None]  # what the run's receipts bind (None: no schema)
    ids: list[ReceiptIds]  # of each receipt of the run, in order


# The ids a receipt holds, for the checks across receipts (_IdChecks): its id, the call ids
# it issued, (tool_call_id, receipt_id) of each link. A plain tuple: a NamedTuple took 7 us
# a receipt to pickle back from a worker, 7% of the verification.
ReceiptIds = tuple[str, list[str], list[tuple[str, str | None]]]


class LineChecker:
    """The self-contained checks of receipts.jsonl lines (run in workers or in-process):
    each receipt on its own, then the links between consecutive receipts of a block."""

    def __init__(self, public_keys: list[dict[str, Any]], schemas: Mapping[str, bytes]) -> None:
        self._schemas = schemas
        self.checker = ReceiptChecker(KeyRing.from_public_keys(public_keys), self._schema)

    def _schema(self, schema_hash: str) -> Any:
        """The bundle's schema of that hash, parsed (_schemas checked that it parses)."""
        data = self._schemas.get(schema_hash)
        return None if data is None else json.loads(data)

    def check(self, block: bytes) -> CheckedBlock:
        """Check the lines of `block` in order, stopping at the first that fails."""
        first: Receipt | None = None
        last: Receipt | None = None
        leaves = []
        bound: set[str | None] = set()
        ids = []
        problem = None
        lines = block.split(b"\n")  # not splitlines: a bare \r is JSON whitespace
        unterminated = lines.pop()  # empty: the block ends with a newline, as each line does
        for line in lines:
            if not line:
                problem = f"a blank line in {RECEIPTS}, where each line holds one receipt"
                break
            if dense := value_count_problem(line):
                problem = (
                    f"a line of {RECEIPTS} {dense}; no receipt a bundle holds does, and parsed"
                    " it would fill gigabytes of memory"
                )
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
            bound.add(receipt.manifest["schema_hash"])
            calls = [call["id"] for call in receipt.tool_calls]
            links = [(link["tool_call_id"], link["receipt_id"]) for link in receipt.links]
            ids.append((receipt.id, calls, links))
        if unterminated and problem is None:  # the end of the file: one spelling, as above
            problem = f"the last line of {RECEIPTS} does not end with a newline"
        if first is None or last is None:
            return CheckedBlock(LinkedRun("", 0, "", "", 0, b""), problem, frozenset(), [])
        run = LinkedRun(
            first.chain, first.seq, first.prev_hash, last.entry_hash, len(leaves), b"".join(leaves)
        )
        return CheckedBlock(run, problem, frozenset(bound), ids)


def _checked(
    source: IO[bytes],
    keyring: KeyRing,
    schemas: Mapping[str, bytes],
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
    # Blocks are read here and handed out a few at a time, not through pool.imap: imap reads
    # the bundle in the pool's own thread, and a pool left mid-imap (a verification that
    # stopped at a failure) could hang in terminate() waiting for that thread (seen once in
    # 15 minutes of the test suite's CI run).
    with ctx.Pool(workers, initializer=_init_worker, initargs=(keys, schemas)) as pool:
        pending: deque[AsyncResult[CheckedBlock]] = deque()
        try:
            for block in _blocks(source):
                pending.append(pool.apply_async(_check_in_worker, (block,)))
                if len(pending) > 2 * workers:  # each worker busy with one, the next queued
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
        finally:
            # Stopped at a failure, blocks are still in flight, and terminate() while the
            # pool's task thread hands them out hung once (test_bundle, 1 run in 26): let the
            # few in flight (at most 2 x workers + 1) finish, so the pool ends idle.
            for result in pending:
                result.wait(_IN_FLIGHT_WAIT_S)


_IN_FLIGHT_WAIT_S = 30.0  # per block: a block takes well under a second to check

_worker: LineChecker | None = None


def _init_worker(public_keys: list[dict[str, Any]], schemas: Mapping[str, bytes]) -> None:
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
