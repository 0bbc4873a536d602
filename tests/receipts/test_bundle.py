"""Export bundles, verified offline: intact bundles pass, every tamper case names its seq."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from receipt_samples import SCHEMAS, UNION, UNION_HASH, build_chain, draft

import receipts.bundle_archive
import receipts.bundle_format
import receipts.bundle_verify
import receipts.bundle_writer
from receipts.bundle_format import MANIFEST, MAX_SMALL_FILE, RECEIPTS, key_file
from receipts.bundle_verify import verify_bundle
from receipts.bundle_writer import ReceiptLine, write_bundle
from receipts.canonical import canonical_json
from receipts.checkpoint import make_checkpoint
from receipts.errors import BundleTooLarge, ReceiptFormatError, VerifierInputError
from receipts.manifest import schema_hash
from receipts.merkle import MerkleTree
from receipts.record import BODY_FIELDS, GENESIS_PREV_HASH, Receipt, entry_hash_of
from receipts.seal import seal
from receipts.signing import Signer

N = 30


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture(scope="module")
def chain(signer: Signer) -> list[Receipt]:
    return build_chain(signer, N)


def keys_of(*signers: Signer) -> list[dict[str, Any]]:
    return [
        {
            "key_id": s.key_id,
            "public_key_pem": s.public_key_pem(),
            "ranges": [{"chain": "acme", "first_seq": 1, "last_seq": None}],
        }
        for s in signers
    ]


def whole_chain_checkpoint(chain: list[Receipt], signer: Signer) -> dict[str, Any]:
    tree = MerkleTree.from_entry_hashes(r.entry_hash for r in chain)
    return make_checkpoint("acme", len(chain), tree.root().hex(), signer)


def export(
    path: Path, chain: list[Receipt], signer: Signer, first: int = 1, last: int | None = None
) -> Path:
    """What ledger.export does: receipts first..last, a checkpoint of the whole chain, and the
    compact ranges that tie the range to it."""
    last = len(chain) if last is None else last
    tree = MerkleTree.from_entry_hashes(r.entry_hash for r in chain)
    checkpoint = make_checkpoint("acme", len(chain), tree.root().hex(), signer)
    write_bundle(
        path,
        [r.to_json_obj() for r in chain[first - 1 : last]],
        SCHEMAS,
        keys_of(signer),
        checkpoint,
        prev_entry_hash=chain[first - 2].entry_hash if first > 1 else "0" * 64,
        proofs={
            "left": [h.hex() for h in tree.compact_range(0, first - 1)],
            "right": [h.hex() for h in tree.compact_range(last, len(chain))],
        },
    )
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, chain, signer) -> Path:
    return export(tmp_path_factory.mktemp("b") / "bundle.tar.gz", chain, signer)


def read(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]


def rewrite(
    path: Path,
    files: dict[str, bytes],
    *,
    fix_manifest: bool = True,
    pax: dict[str, dict[str, str]] | None = None,
) -> Path:
    """Repack a bundle, as an attacker would: by default with file hashes brought up to date;
    `pax` gives members PAX header records (by member name)."""
    files = dict(files)
    if fix_manifest:
        manifest = json.loads(files[MANIFEST])
        manifest["files"] = {
            n: hashlib.sha256(d).hexdigest() for n, d in files.items() if n != MANIFEST
        }
        manifest["receipts"] = len(files[RECEIPTS].splitlines())
        files[MANIFEST] = canonical_json(manifest)
    out = path.with_name("tampered-" + path.name)
    with gzip.open(out, "wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.pax_headers = (pax or {}).get(name, {})
            tar.addfile(info, io.BytesIO(data))
    return out


def lines_of(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in files[RECEIPTS].splitlines()]


def with_lines(files: dict[str, bytes], lines: list[dict[str, Any]]) -> dict[str, bytes]:
    return {**files, RECEIPTS: b"".join(canonical_json(o) + b"\n" for o in lines)}


def resign(obj: dict[str, Any], signer: Signer) -> dict[str, Any]:
    import base64

    obj["key_id"] = signer.key_id
    obj["entry_hash"] = entry_hash_of({k: obj[k] for k in BODY_FIELDS})
    obj["signature"] = base64.b64encode(signer.sign(bytes.fromhex(obj["entry_hash"]))).decode()
    return obj


def test_intact_bundle_verifies_pinned_and_unpinned(bundle: Path, signer: Signer) -> None:
    pinned = verify_bundle(bundle, pinned=signer.public_key_pem())
    assert pinned.ok and pinned.checked == N and pinned.tree_size == N, pinned
    assert "pinned" in pinned.notes[0]
    unpinned = verify_bundle(bundle)
    assert unpinned.ok and "not origin" in unpinned.notes[0]
    # the keys trusted are named, to be compared with the operator's out of band
    assert unpinned.notes[0].startswith(f"trusted the bundle's own keys ({signer.key_id}): ")
    assert pinned.to_json_obj()["ok"] is True


def test_layout_and_determinism(chain, signer, bundle: Path) -> None:
    files = read(bundle)
    assert set(files) == {
        MANIFEST,
        RECEIPTS,
        "checkpoint.json",
        "proofs.json",
        "keys.json",
        key_file(signer.key_id),
        f"schemas/{UNION_HASH}.json",
    }
    assert [json.loads(x)["seq"] for x in files[RECEIPTS].splitlines()] == list(range(1, N + 1))
    assert hashlib.sha256(files[f"schemas/{UNION_HASH}.json"]).hexdigest() == UNION_HASH
    checkpoint = json.loads(files["checkpoint.json"])
    outputs = []
    for _ in range(2):
        out = io.BytesIO()
        write_bundle(out, chain, SCHEMAS, keys_of(signer), checkpoint)
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1]  # same inputs, same bytes: no timestamps leak in
    paths = [bundle.with_name(name) for name in ("one.tar.gz", "two.tar.gz")]
    for path in paths:  # nor the file's name (gzip keeps the one it is written to)
        write_bundle(path, chain, SCHEMAS, keys_of(signer), checkpoint)
    assert paths[0].read_bytes() == paths[1].read_bytes() == outputs[0]


def test_receipts_are_read_twice_and_never_spooled(tmp_path: Path, chain, signer) -> None:
    """The manifest, which hashes receipts.jsonl, comes first, so the writer reads the receipts
    twice rather than hold them: a function is called twice, a one-shot iterator is read into
    a list, and every form writes the same bytes."""
    checkpoint = whole_chain_checkpoint(chain, signer)
    calls: list[int] = []

    def again() -> list[Receipt]:
        calls.append(1)
        return chain

    outputs = []
    for source in (chain, again, iter(chain), (ReceiptLine.of(r) for r in chain)):
        out = io.BytesIO()
        write_bundle(out, source, SCHEMAS, keys_of(signer), checkpoint)
        outputs.append(out.getvalue())
    assert len(calls) == 2
    assert len(set(outputs)) == 1
    with tarfile.open(fileobj=io.BytesIO(outputs[0]), mode="r:gz") as tar:
        names = tar.getnames()
    assert names[0] == MANIFEST and names[-1] == RECEIPTS


@pytest.mark.parametrize("change", ["edited", "shorter", "longer"])
def test_receipts_that_change_between_the_two_reads_leave_no_bundle(
    tmp_path: Path, chain, signer, change: str
) -> None:
    """A source that answers differently the second time (a database edited mid-export) is
    ReceiptFormatError, and the unfinished file is removed: none is left to mislead."""
    checkpoint = whole_chain_checkpoint(chain, signer)
    reads: list[int] = []

    def receipts() -> list[Receipt | dict[str, Any]]:
        reads.append(1)
        if len(reads) == 1:
            return chain[:-1] if change == "longer" else list(chain)
        if change == "shorter":
            return chain[:-1]
        obj = chain[N // 2].to_json_obj()
        edited = obj | {"entry_hash": obj["entry_hash"][::-1]}  # the same length: the hash tells
        return [*chain[: N // 2], edited, *chain[N // 2 + 1 :]] if change == "edited" else chain

    path = tmp_path / "bundle.tar.gz"
    path.write_bytes(b"an older bundle")
    with pytest.raises(ReceiptFormatError, match="changed between the bundle's two reads"):
        write_bundle(path, receipts, SCHEMAS, keys_of(signer), checkpoint)
    assert not path.exists()


def test_a_write_that_fails_ends_its_read_of_the_receipts_at_once(signer) -> None:
    """A receipts generator (an export's database read, inside its transaction) is closed
    when the write fails halfway, not whenever the exception that stopped it is collected."""
    chain = build_chain(signer, 400)  # enough that the disk fills inside receipts.jsonl
    checkpoint = whole_chain_checkpoint(chain, signer)
    open_reads: list[int] = []
    reading_when_full: list[int] = []

    def receipts() -> Iterator[Receipt]:
        open_reads.append(1)
        try:
            yield from chain
        finally:
            open_reads.pop()

    class FillingDisk(io.RawIOBase):
        written = 0

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            if self.written > 20_000:
                reading_when_full.append(len(open_reads))  # gzip's close writes once more
                raise OSError(28, "No space left on device")
            self.written += len(data)
            return len(data)

    with pytest.raises(OSError, match="No space left") as failed:
        write_bundle(FillingDisk(), receipts, SCHEMAS, keys_of(signer), checkpoint)
    assert reading_when_full[0] == 1  # the disk filled during the second read
    assert failed.value is not None and open_reads == []


def distinct_schemas(count: int, size: int) -> dict[str, dict[str, Any]]:
    """``count`` distinct tool unions, each about ``size`` bytes past UNION, under their real
    hashes (an agent whose tool descriptions change from call to call binds a new one each
    time)."""
    schemas = ({**UNION, "description": f"{i} " + "x" * size} for i in range(count))
    return {schema_hash(s): s for s in schemas}


def binding(schemas: dict[str, dict[str, Any]], signer: Signer) -> list[Receipt]:
    """A chain of at least N receipts that binds every one of ``schemas`` (tool unions): a
    bundle holds exactly the schemas its receipts bind."""
    receipts: list[Receipt] = []
    hashes = list(schemas)
    for seq in range(1, max(N, len(hashes)) + 1):
        bound = hashes[(seq - 1) % len(hashes)]
        sample = draft(city=f"City {seq}")
        sample = dataclasses.replace(
            sample, schema=schemas[bound], manifest={**sample.manifest, "schema_hash": bound}
        )
        prev = receipts[-1].entry_hash if receipts else GENESIS_PREV_HASH
        receipts.append(seal(sample, seq=seq, prev_hash=prev, signer=signer))
    return receipts


@pytest.mark.parametrize(
    ("bound", "limit", "size"), [("MAX_SMALL_TOTAL", 1 << 20, 20_000), ("MAX_MEMBERS", 40, 10)]
)
def test_the_writer_keeps_within_the_bounds_a_reader_holds_a_bundle_to(
    tmp_path: Path,
    chain,
    signer,
    monkeypatch: pytest.MonkeyPatch,
    bound: str,
    limit: int,
    size: int,
) -> None:
    """A chain of many distinct tool sets was exported as a bundle that `callproof verify`
    refused (past 256 MiB of schemas, or 100,000 files). The writer refuses it, before
    writing, with BundleTooLarge; the largest bundle it writes verifies under the same bound."""
    for module in (receipts.bundle_writer, receipts.bundle_archive):
        monkeypatch.setattr(module, bound, limit)
    written = None
    for count in range(1, 200):
        path = tmp_path / f"bundle-{count}.tar.gz"
        schemas = {**SCHEMAS, **distinct_schemas(count, size)}
        bound_chain = binding(schemas, signer)
        try:
            write_bundle(
                path,
                bound_chain,
                schemas,
                keys_of(signer),
                whole_chain_checkpoint(bound_chain, signer),
            )
        except BundleTooLarge as exc:
            refused = str(exc)
            break
        written, length = path, len(bound_chain)
    else:
        pytest.fail(f"{count} schemas of {size} bytes: no bound held")
    assert written is not None and not path.exists()  # refused before a byte was written
    assert refused.startswith(f"a bundle of seqs 1..{len(bound_chain)} of chain 'acme' would ")
    assert refused.endswith("export a shorter range of receipts"), refused
    report = verify_bundle(written, signer.public_key_pem())
    assert report.ok and report.checked == length, report
    with tarfile.open(written, "r:gz") as tar:  # and it came close: the bound is not padded
        members = tar.getmembers()
    small = sum(512 + -(-m.size // 512) * 512 for m in members if m.name != RECEIPTS)
    if bound == "MAX_MEMBERS":
        assert len(members) == limit
    else:
        assert limit - small < 2 * size, small  # within about one schema of the bound


def test_the_writer_accepts_no_bundle_its_reader_refuses_even_at_the_exact_bound(
    tmp_path: Path, chain, signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The smallest MAX_SMALL_TOTAL the writer accepts for a bundle (found by bisection) is
    one the reader accepts it under: the writer's count of tar headers, padding, the end of
    the archive and tarfile's read-ahead is not short of the reader's."""
    schemas = {**SCHEMAS, **distinct_schemas(7, 3_000)}
    chain = binding(schemas, signer)
    checkpoint = whole_chain_checkpoint(chain, signer)
    path = tmp_path / "bundle.tar.gz"
    low, high = 1, 1 << 20  # the writer refuses at low, accepts at high
    while high - low > 1:
        middle = (low + high) // 2
        monkeypatch.setattr(receipts.bundle_writer, "MAX_SMALL_TOTAL", middle)
        try:
            write_bundle(path, chain, schemas, keys_of(signer), checkpoint)
            high = middle
        except BundleTooLarge:
            low = middle
    monkeypatch.setattr(receipts.bundle_writer, "MAX_SMALL_TOTAL", high)
    write_bundle(path, chain, schemas, keys_of(signer), checkpoint)
    monkeypatch.setattr(receipts.bundle_archive, "MAX_SMALL_TOTAL", high)
    report = verify_bundle(path, signer.public_key_pem())
    assert report.ok and report.checked == N, report


def test_a_receipt_longer_than_a_bundle_may_hold_is_refused_by_name(
    tmp_path: Path, chain, signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retained payload can make one receipt longer than a verifier reads (max_body_bytes
    has no ceiling): no range holds it, and the refusal says which receipt and why."""
    lengths = [len(ReceiptLine.of(r).text) for r in chain]
    monkeypatch.setattr(receipts.bundle_writer, "MAX_RECEIPT_LINE", max(lengths) - 1)
    longest = lengths.index(max(lengths)) + 1
    path = tmp_path / "bundle.tar.gz"
    with pytest.raises(BundleTooLarge, match=f"receipt seq {longest} of chain 'acme' is "):
        write_bundle(path, chain, SCHEMAS, keys_of(signer), whole_chain_checkpoint(chain, signer))
    assert not path.exists()


def test_a_manifest_of_many_schemas_is_encoded_in_linear_time(
    chain, signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msgspec sorts a map that is in order but for one key (receipts.jsonl after the
    schemas) in quadratic time: 21 s for 100,000 schemas, the GIL held and the gateway's
    event loop frozen. The writer hands it the map sorted."""
    longest: list[float] = [0.0]

    def timed(value: Any) -> bytes:
        started = time.perf_counter()
        try:
            return canonical_json(value)
        finally:
            longest[0] = max(longest[0], time.perf_counter() - started)

    monkeypatch.setattr(receipts.bundle_writer, "canonical_json", timed)
    schemas = {**SCHEMAS, **distinct_schemas(60_000, 0)}
    checkpoint = whole_chain_checkpoint(chain, signer)
    write_bundle(io.BytesIO(), chain, schemas, keys_of(signer), checkpoint)
    assert longest[0] < 1, f"one encoding took {longest[0]:.1f} s"  # some 0.01 s; 8 s unsorted


@pytest.mark.parametrize("change", ["edited", "dropped", "added", "reordered"])
def test_schemas_that_change_between_the_two_reads_leave_no_bundle(
    tmp_path: Path, chain, signer, change: str
) -> None:
    """Schemas are read twice, as receipts are (a function called twice: many distinct tool
    sets are never held together); a second read that differs leaves no bundle."""
    first = sorted({**SCHEMAS, **distinct_schemas(3, 10)}.items())
    second = {
        "edited": [*first[:-1], (first[-1][0], {"description": "edited"})],
        "dropped": first[:-1],
        "added": [*first, ("f" * 64, {})],
        "reordered": first[::-1],
    }[change]
    reads = iter([first, second])
    path = tmp_path / "bundle.tar.gz"
    with pytest.raises(
        ReceiptFormatError, match="changed between the bundle's two reads|in hash order"
    ):
        write_bundle(
            path, chain, lambda: next(reads), keys_of(signer), whole_chain_checkpoint(chain, signer)
        )
    assert not path.exists()


def test_range_bundle_verifies_against_whole_chain_checkpoint(
    tmp_path: Path, chain, signer
) -> None:
    path = export(tmp_path / "range.tar.gz", chain, signer, first=9, last=21)
    report = verify_bundle(path, pinned=signer.public_key_pem(), allow_range=True)
    assert report.ok and report.checked == 13 and report.tree_size == N, report
    assert (report.first_seq, report.last_seq) == (9, 21)
    files = read(path)
    proofs = json.loads(files["proofs.json"])
    proofs["left"][0] = "00" * 32
    bad = verify_bundle(
        rewrite(path, {**files, "proofs.json": canonical_json(proofs)}), allow_range=True
    )
    assert not bad.ok and "Merkle root" in bad.reason


@pytest.mark.parametrize(("first", "last"), [(3, N), (1, N - 2)], ids=["head-cut", "tail-cut"])
def test_receipts_cut_off_an_end_fail_unless_a_range_was_asked_for(
    tmp_path: Path, chain, signer, first: int, last: int
) -> None:
    """proofs.json is not signed: whoever holds a whole-chain bundle can drop receipts at
    either end and supply the compact ranges that still reach the signed root. Only a
    reader who asked for a range accepts one, and every report names the seqs it checked."""
    path = export(tmp_path / "cut.tar.gz", chain, signer, first=first, last=last)
    report = verify_bundle(path, pinned=signer.public_key_pem())
    assert not report.ok
    assert f"seq {first}..{last} of the {N} receipts its checkpoint signs" in report.reason
    assert verify_bundle(path, signer.public_key_pem(), allow_range=True).ok


def test_a_duplicate_key_or_any_other_spelling_fails(bundle: Path, signer) -> None:
    """Python keeps the last of two "output" keys, other readers the first: a line must be
    the one canonical spelling of its receipt, so no reader sees another call."""
    files = read(bundle)
    raw = files[RECEIPTS].split(b"\n")
    fake = b'{"output":{"tool_calls":[{"name":"get_weather","arguments":{"city":"Tokyo"}}]},'
    # what each says is named per case: a random signature's base64 may hold "NaN" itself
    for spelled, seq, says in [
        (fake + raw[0][1:], 1, "canonical JSON"),
        (raw[0].replace(b",", b", ", 1), 1, "canonical JSON"),
        (raw[0] + b"\r", 1, "canonical JSON"),
        (raw[0].replace(b'"arguments":{', b'"arguments":{"a":NaN,', 1), 1, "malformed receipt"),
        (b"", 2, "blank line"),
    ]:
        lines = [spelled, *raw[1:]] if spelled else [raw[0], b"", *raw[1:]]
        report = verify_bundle(rewrite(bundle, {**files, RECEIPTS: b"\n".join(lines)}))
        assert not report.ok and says in report.reason, (spelled[:40], report)
        assert report.first_failure_seq == seq


def test_edited_receipt(bundle: Path, signer) -> None:
    files = read(bundle)
    lines = lines_of(files)
    lines[11]["output"]["tool_calls"][0]["arguments"]["city"] = "Atlantis"
    report = verify_bundle(rewrite(bundle, with_lines(files, lines)), signer.public_key_pem())
    assert (report.first_failure_seq, report.checked) == (12, 11)
    assert "entry_hash" in report.reason


def test_deleted_receipt(bundle: Path, signer) -> None:
    files = read(bundle)
    lines = lines_of(files)
    del lines[4]
    report = verify_bundle(rewrite(bundle, with_lines(files, lines)), signer.public_key_pem())
    assert report.first_failure_seq == 5 and "missing" in report.reason


def test_swapped_receipts(bundle: Path, signer) -> None:
    files = read(bundle)
    lines = lines_of(files)
    lines[7], lines[8] = lines[8], lines[7]
    report = verify_bundle(rewrite(bundle, with_lines(files, lines)), signer.public_key_pem())
    assert report.first_failure_seq == 8


def test_inserted_forged_receipt(bundle: Path, chain, signer) -> None:
    attacker = Signer.generate()
    files = read(bundle)
    lines = lines_of(files)
    forged = seal(draft(city="Forged"), seq=6, prev_hash=chain[4].entry_hash, signer=attacker)
    lines.insert(5, forged.to_json_obj())
    tampered = rewrite(bundle, with_lines(files, lines))
    report = verify_bundle(tampered, signer.public_key_pem())
    assert report.first_failure_seq == 6 and "unknown key" in report.reason


def test_receipt_resigned_with_another_key(bundle: Path, signer) -> None:
    files = read(bundle)
    lines = lines_of(files)
    lines[2]["usage"]["prompt_tokens"] = 1
    resign(lines[2], Signer.generate())
    report = verify_bundle(rewrite(bundle, with_lines(files, lines)), signer.public_key_pem())
    assert report.first_failure_seq == 3 and "unknown key" in report.reason


def sealed(signer: Signer, changes: dict[int, Any]) -> list[Receipt]:
    """A chain of N receipts, each with one tool call, signed by ``signer``: ``changes[seq]``
    (the receipts so far) gives receipt seq its (call id, links, receipt id), any None kept."""
    receipts: list[Receipt] = []
    for seq in range(1, N + 1):
        sample = draft(city=f"City {seq}")
        call_id, links, receipt_id = changes.get(seq, lambda _: (None, None, None))(receipts)
        if call_id:
            calls = [{**sample.output["tool_calls"][0], "id": call_id}]
            sample = dataclasses.replace(sample, output={**sample.output, "tool_calls": calls})
        sample = dataclasses.replace(sample, links=links or [])
        prev = receipts[-1].entry_hash if receipts else GENESIS_PREV_HASH
        receipts.append(seal(sample, seq=seq, prev_hash=prev, signer=signer, receipt_id=receipt_id))
    return receipts


def call_of(receipt: Receipt) -> str:
    return receipt.tool_calls[0]["id"]


def link(receipt: Receipt, call_id: str | None = None) -> list[dict[str, Any]]:
    return [{"tool_call_id": call_id or call_of(receipt), "receipt_id": receipt.id}]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: (None, link(r[1], call_of(r[0])), None), "which rcpt_"),  # another's call
        (lambda r: (None, link(r[1], "call_elsewhere"), None), "which it did not issue"),
        (lambda r: (call_of(r[1]), None, None), "tool call id call_"),  # issued twice
        (lambda r: (None, None, r[1].id), "appears twice"),  # a receipt id twice
    ],
)
def test_links_and_ids_across_the_receipts_are_checked(
    tmp_path: Path, signer: Signer, change: Any, says: str
) -> None:
    """A signer could write a receipt answering a call its linked receipt never issued, or
    issue a call id or a receipt id twice, and the bundle verified."""
    bundle = export(tmp_path / "b.tar.gz", sealed(signer, {3: change}), signer)
    for workers in (1, 2):  # the ids travel from the worker processes
        report = verify_bundle(bundle, workers=workers)
        assert not report.ok and report.first_failure_seq == 3 and report.checked == 2, report
        assert says in report.reason, report


def test_a_link_is_checked_in_the_bundle_and_named_when_before_its_range(
    tmp_path: Path, signer: Signer
) -> None:
    """A link to an earlier receipt that issued the call holds; one to a later receipt fails
    (in a whole chain nothing precedes seq 1); one to a receipt before a range is noted."""
    answered = sealed(signer, {3: lambda r: (None, link(r[0]), None)})
    assert verify_bundle(export(tmp_path / "ok.tar.gz", answered, signer)).ok
    report = verify_bundle(
        export(tmp_path / "r.tar.gz", answered, signer, first=2), allow_range=True
    )
    assert (
        report.ok and "1 link(s) name receipts before seq 2, outside the bundle" in report.notes[1]
    )
    later = "rcpt_" + "0" * 24  # the id receipt 5 gets, linked to by receipt 3
    ahead = sealed(
        signer,
        {
            3: lambda r: (None, [{"tool_call_id": "call_x", "receipt_id": later}], None),
            5: lambda r: (None, None, later),
        },
    )
    report = verify_bundle(export(tmp_path / "ahead.tar.gz", ahead, signer))
    assert not report.ok and report.first_failure_seq == 3 and "no earlier receipt" in report.reason
    report = verify_bundle(
        export(tmp_path / "ahead-r.tar.gz", ahead, signer, first=2), allow_range=True
    )
    assert not report.ok and report.first_failure_seq == 5, report
    assert "linked to by an earlier receipt" in report.reason


def test_whole_bundle_resigned_only_pinning_catches(tmp_path: Path, chain) -> None:
    """The trust model: unpinned, a bundle re-signed end to end by another key is
    self-consistent; pinning the operator's key is what rejects it, at seq 1."""
    operator, attacker = Signer.generate(), Signer.generate()
    path = export(tmp_path / "forged.tar.gz", build_chain(attacker, 5), attacker)
    assert verify_bundle(path).ok
    report = verify_bundle(path, pinned=operator.public_key_pem())
    assert report.first_failure_seq == 1 and "unknown key" in report.reason


def test_truncated_tail(bundle: Path, signer) -> None:
    files = read(bundle)
    lines = lines_of(files)[:-3]
    report = verify_bundle(rewrite(bundle, with_lines(files, lines)), signer.public_key_pem())
    assert report.first_failure_seq == N - 2 and "truncated" in report.reason


def test_edited_schema(bundle: Path, signer) -> None:
    files = read(bundle)
    name = f"schemas/{UNION_HASH}.json"
    schema = json.loads(files[name])
    schema["oneOf"][0]["properties"]["arguments"]["additionalProperties"] = True
    report = verify_bundle(rewrite(bundle, {**files, name: canonical_json(schema)}))
    assert report.first_failure_seq == 1 and "edited" in report.reason


def test_a_schema_no_receipt_binds_or_not_in_its_one_spelling_fails(
    bundle: Path, signer: Signer
) -> None:
    """A bundle holds JCS(schema) for exactly the schemas its receipts bind: an extra schema
    (under its own hash or another) and a bound one spelled otherwise all verified."""
    files = read(bundle)
    bound = f"schemas/{UNION_HASH}.json"
    extra = {"type": "string"}
    wrong = "ab" * 32
    cases = [
        ({f"schemas/{schema_hash(extra)}.json": canonical_json(extra)}, "no receipt binds"),
        ({f"schemas/{wrong}.json": canonical_json(extra)}, "no receipt binds"),
        ({bound: json.dumps(UNION, indent=1).encode()}, "is not the canonical JSON"),
    ]
    for changed, says in cases:
        name = next(iter(changed))
        report = verify_bundle(rewrite(bundle, {**files, **changed}), signer.public_key_pem())
        assert not report.ok and name in report.reason and says in report.reason, report


def test_file_hash_mismatch_without_a_bad_receipt(bundle: Path) -> None:
    files = read(bundle)
    spaced = files["keys.json"].replace(b"[", b"[ ", 1)  # same JSON, other bytes
    report = verify_bundle(rewrite(bundle, {**files, "keys.json": spaced}, fix_manifest=False))
    assert not report.ok and report.first_failure_seq is None
    assert "SHA-256" in report.reason and report.checked == N


def test_forged_checkpoint(bundle: Path, signer) -> None:
    files = read(bundle)
    cp = json.loads(files["checkpoint.json"])
    cp["root_hash"] = "ab" * 32
    report = verify_bundle(rewrite(bundle, {**files, "checkpoint.json": canonical_json(cp)}))
    assert not report.ok and "checkpoint signature" in report.reason


def test_unreadable_and_foreign_archives(tmp_path: Path, bundle: Path) -> None:
    with pytest.raises(VerifierInputError):
        verify_bundle(tmp_path / "nope.tar.gz")
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a gzip file")
    assert "not a readable" in verify_bundle(junk).reason
    extra = rewrite(bundle, {**read(bundle), "../evil": b"x"})
    assert "unexpected bundle member" in verify_bundle(extra).reason


def test_progress_and_worker_processes(bundle: Path, signer) -> None:
    seen: list[tuple[int, int]] = []
    report = verify_bundle(
        bundle, signer.public_key_pem(), progress=lambda d, t: seen.append((d, t)), workers=2
    )
    assert report.ok and seen[-1] == (N, N)
    files = read(bundle)
    lines = lines_of(files)
    lines[20]["finish_reason"] = "stop"
    tampered = rewrite(bundle, with_lines(files, lines))
    assert verify_bundle(tampered, workers=2).first_failure_seq == 21


@pytest.mark.parametrize("workers", [1, 2])
def test_links_are_checked_across_block_boundaries(
    bundle: Path, signer, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Workers link receipts inside a block and the parent links blocks together: with
    blocks of a few receipts, a deletion or swap at every position is caught at its seq."""
    monkeypatch.setattr(receipts.bundle_verify, "BLOCK", 2500)  # a few receipts per block
    pem = signer.public_key_pem()
    report = verify_bundle(bundle, pem, workers=workers)
    assert report.ok and report.checked == N
    files = read(bundle)
    for i in range(1, N - 1, 1 if workers == 1 else 7):
        lines = lines_of(files)
        del lines[i]
        report = verify_bundle(rewrite(bundle, with_lines(files, lines)), pem, workers=workers)
        assert (report.first_failure_seq, report.checked) == (i + 1, i), report
        lines = lines_of(files)
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
        report = verify_bundle(rewrite(bundle, with_lines(files, lines)), pem, workers=workers)
        assert (report.first_failure_seq, report.checked) == (i + 1, i), report


def test_lines_longer_than_a_block_and_bare_carriage_returns(
    bundle: Path, signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receipt line longer than a worker's block is joined, not split; a \r inside a line
    is not a line break (the line is read whole, and fails as not canonical)."""
    monkeypatch.setattr(receipts.bundle_verify, "BLOCK", 300)  # lines are ~1,500 bytes
    pem = signer.public_key_pem()
    assert verify_bundle(bundle, pem, workers=1).ok
    files = read(bundle)
    spaced = files[RECEIPTS].replace(b'{"chain"', b'{\r"chain"', 1)
    tampered = rewrite(bundle, {**files, RECEIPTS: spaced}, fix_manifest=False)
    report = verify_bundle(tampered, pem, workers=1)
    assert (report.checked, report.first_failure_seq) == (0, 1)
    assert "canonical JSON" in report.reason


def test_writer_refuses_a_gap(tmp_path: Path, chain, signer) -> None:
    cp = make_checkpoint("acme", N, "00" * 32, signer)
    with pytest.raises(ReceiptFormatError, match="consecutive"):
        write_bundle(tmp_path / "x.tar.gz", [chain[0], chain[2]], SCHEMAS, keys_of(signer), cp)


def test_a_bundle_unpacked_and_packed_again_still_verifies(
    tmp_path: Path, bundle: Path, signer
) -> None:
    import subprocess

    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "xzf", str(bundle), "-C", str(unpacked)], check=True)
    repacked = tmp_path / "repacked.tar.gz"
    subprocess.run(["tar", "czf", str(repacked), "-C", str(unpacked), "."], check=True)
    assert verify_bundle(repacked, signer.public_key_pem()).ok


def test_pinned_ranges_hold_a_leaked_retired_key_to_the_receipts_it_signed(
    tmp_path: Path,
) -> None:
    """Keys.json is not signed: a thief of the retired key can widen its range there. The
    ranges saved from GET /audit/keys before the leak are what hold it back."""
    old, new = Signer.generate(), Signer.generate()
    chain, prev = [], GENESIS_PREV_HASH
    for seq in range(1, 12):  # old signs 1..5, new 6..10, the thief (old) appends 11
        signer = new if 6 <= seq <= 10 else old
        chain.append(seal(draft(city=f"City {seq}"), seq=seq, prev_hash=prev, signer=signer))
        prev = chain[-1].entry_hash
    claimed = keys_of(old, new)  # both "current": the thief's keys.json
    path = tmp_path / "forged.tar.gz"
    write_bundle(
        path,
        [r.to_json_obj() for r in chain],
        SCHEMAS,
        claimed,
        whole_chain_checkpoint(chain, old),
        prev_entry_hash="0" * 64,
        proofs={"left": [], "right": []},
    )
    saved = keys_of(old, new)  # what GET /audit/keys said after the rotation
    saved[0]["ranges"][0]["last_seq"] = 5
    saved[1]["ranges"][0]["first_seq"] = 6

    report = verify_bundle(path, json.dumps(saved))
    assert not report.ok and report.first_failure_seq == 11, report
    assert "each within its pinned seq ranges" in report.notes[0]
    with_pems = verify_bundle(path, old.public_key_pem() + new.public_key_pem())
    assert with_pems.ok and "pins no seq ranges" in with_pems.notes[0]


@pytest.mark.parametrize("name", [RECEIPTS, "checkpoint.json", f"schemas/{'ab' * 32}.json"])
def test_a_file_nested_past_the_json_readers_depth_fails_cleanly(bundle: Path, name: str) -> None:
    """A schema file no receipt binds included: its RecursionError crashed the verifier."""
    deep = rewrite(bundle, {**read(bundle), name: b"[" * 200_000 + b"]" * 200_000 + b"\n"})
    report = verify_bundle(deep)
    assert not report.ok and "nests deeper" in report.reason
    assert name == RECEIPTS or report.reason.startswith(name), report


def test_a_receipt_line_past_any_plausible_size_fails_without_reading_it_whole(
    bundle: Path, tmp_path: Path
) -> None:
    files = read(bundle)
    files[RECEIPTS] = files[RECEIPTS] + b"x" * (MAX_SMALL_FILE + (2 << 20)) + b"\n"
    report = verify_bundle(rewrite(bundle, files))
    assert not report.ok and "no receipt is that long" in report.reason


DENSE = b"[" + b"{}," * 1_000_000 + b"{}]"  # 3 MB that json.loads makes 72 MB of dicts


@pytest.mark.parametrize(
    "name", [MANIFEST, "keys.json", "checkpoint.json", f"schemas/{'ab' * 32}.json", RECEIPTS]
)
def test_a_file_too_dense_to_parse_in_bounded_memory_fails_unparsed(
    bundle: Path, name: str
) -> None:
    """Within the byte bounds, `[{},{},...]` parses to 25 times its size: a 200 KB bundle took
    3.4 GB to verify. Past MAX_JSON_VALUES a file or receipt line is refused unparsed."""
    import tracemalloc

    files = {**read(bundle), name: DENSE + (b"\n" if name == RECEIPTS else b"")}
    dense = rewrite(bundle, files, fix_manifest=name != MANIFEST)
    tracemalloc.start()
    try:
        report = verify_bundle(dense)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not report.ok and "may hold 2,000,000 JSON values or more" in report.reason, report
    assert report.reason.startswith("a line of receipts.jsonl" if name == RECEIPTS else name)
    assert peak < 40 << 20, peak  # the bundle's bytes, a few times over: nothing parsed


def test_the_writer_puts_no_file_or_receipt_too_dense_to_verify_in_a_bundle(
    tmp_path: Path, chain, signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = whole_chain_checkpoint(chain, signer)
    path = tmp_path / "bundle.tar.gz"
    dense = {"ab" * 32: {"enum": [0] * 2_000_000}}  # a schema no gateway's default limits take
    with pytest.raises(BundleTooLarge, match=f"schemas/{'ab' * 32}.json, which may hold 2,000,"):
        write_bundle(path, chain, {**SCHEMAS, **dense}, keys_of(signer), checkpoint)
    monkeypatch.setattr(
        receipts.bundle_format, "MAX_JSON_VALUES", 40
    )  # a receipt's retained payload
    with pytest.raises(BundleTooLarge, match="receipt seq 1 of chain 'acme' may hold 40 JSON"):
        write_bundle(path, chain, SCHEMAS, keys_of(signer), checkpoint)
    assert not path.exists()


def test_writer_and_verifier_draw_the_json_value_bound_at_the_same_byte(
    tmp_path: Path, chain, signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule is a count of bytes an independent verifier reproduces: 199 of `[ { , :` pass
    a bound of 200, and 200 do not, for the writer and the reader alike."""
    monkeypatch.setattr(receipts.bundle_format, "MAX_JSON_VALUES", 200)
    union = sum(map(canonical_json(UNION).count, (b"[", b"{", b",", b":")))
    # UNION's own bytes, then "," ":" "[" and k - 1 commas for k examples
    counted = {n: {**UNION, "examples": [0] * (n - union - 2)} for n in (199, 200)}
    under = tmp_path / "under.tar.gz"
    chain = binding({schema_hash(counted[199]): counted[199]}, signer)
    checkpoint = whole_chain_checkpoint(chain, signer)
    name = f"schemas/{schema_hash(counted[199])}.json"
    schemas = {schema_hash(counted[199]): counted[199]}
    write_bundle(under, chain, schemas, keys_of(signer), checkpoint)
    assert verify_bundle(under, signer.public_key_pem()).ok
    with pytest.raises(BundleTooLarge, match=f"{name}, which may hold 200"):
        write_bundle(
            tmp_path / "over.tar.gz",
            chain,
            {schema_hash(counted[199]): counted[200]},
            keys_of(signer),
            checkpoint,
        )
    files = read(under)
    files[name] = canonical_json(counted[200])
    report = verify_bundle(rewrite(under, files), signer.public_key_pem())
    assert not report.ok and "may hold 200 JSON values" in report.reason, report


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"v": True}, "format version True"),
        ({"first_seq": 2}, "announces seq 2..30"),
        ({"last_seq": 31}, "announces seq 1..31"),
        ({"receipts": 29}, "announces 29 receipts, receipts.jsonl holds 30"),
        ({"receipts": True}, "receipts must be an integer, not True"),
    ],
)
def test_a_manifest_that_misstates_the_bundle_fails(
    bundle: Path, change: dict[str, Any], says: str
) -> None:
    files = read(bundle)
    files[MANIFEST] = canonical_json({**json.loads(files[MANIFEST]), **change})
    report = verify_bundle(rewrite(bundle, files, fix_manifest=False))  # no other file changed
    assert not report.ok and says in report.reason, report


def test_right_hand_proof_hashes_past_a_whole_chain_fail(bundle: Path) -> None:
    files = read(bundle)
    proofs = json.loads(files["proofs.json"])
    files["proofs.json"] = canonical_json({**proofs, "right": ["00" * 32]})
    report = verify_bundle(rewrite(bundle, files))
    assert not report.ok and "already reaches the checkpoint" in report.reason, report


def test_a_key_file_that_is_not_its_key_id_names_the_chain(bundle: Path, signer: Signer) -> None:
    """Unpinned, the bundle's own key files are what is trusted: one swapped for another key
    fails, and the report still names the chain (it said '?')."""
    files = read(bundle)
    files[key_file(signer.key_id)] = Signer.generate().public_key_pem().encode()
    report = verify_bundle(rewrite(bundle, files))
    assert not report.ok and "does not match" in report.reason
    assert report.chain == json.loads(files[MANIFEST])["chain"]


def test_verifying_writes_nothing_to_disk(
    bundle: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """receipts.jsonl is streamed from the archive, never spooled: a gzip bomb cannot fill the
    disk (it had every byte of receipts.jsonl copied to a temp file, with no limit)."""
    import tempfile

    def no_temp_files(*args: object, **kwargs: object) -> None:
        raise AssertionError("verification wrote a temp file")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_temp_files)
    monkeypatch.setattr(tempfile, "SpooledTemporaryFile", no_temp_files)
    assert verify_bundle(bundle, signer.public_key_pem()).ok


def read_counter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most uncompressed bytes any archive read has taken so far (one item, updated)."""
    most = [0]
    read = receipts.bundle_archive._Budget.read

    def counted(self: Any, size: int = -1) -> bytes:
        data = read(self, size)
        most[0] = max(most[0], self.count)
        return data

    monkeypatch.setattr(receipts.bundle_archive._Budget, "read", counted)
    return most


@pytest.mark.parametrize(
    ("announced", "cap"),
    [(N, "MAX_SMALL_FILE"), (10**12, "MAX_RECEIPTS_BYTES")],
    ids=["per-announced-receipt", "hard-ceiling"],
)
def test_receipts_past_their_limit_are_refused_before_they_are_read(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, announced: int, cap: str
) -> None:
    """A gzip bomb as receipts.jsonl: its declared size is refused before a byte of it is
    decompressed, against MAX_SMALL_FILE per receipt the manifest announces or the ceiling."""
    monkeypatch.setattr(receipts.bundle_archive, cap, 1 << 16)  # 64 KiB: the bomb is 4 MiB of zeros
    most = read_counter(monkeypatch)
    files = read(bundle)
    files[MANIFEST] = canonical_json({**json.loads(files[MANIFEST]), "receipts": announced})
    files[RECEIPTS] += bytes(4 << 20)
    report = verify_bundle(rewrite(bundle, files, fix_manifest=False))
    assert not report.ok and "'receipts.jsonl' declares 4" in report.reason, report
    assert "past its limit" in report.reason
    assert most[0] < 1 << 20, most  # the small files and headers, none of the bomb


def test_a_sparse_member_is_refused(bundle: Path) -> None:
    """A GNU sparse member reads as zeros its archive never stored (1 TiB from a few bytes)."""
    files = read(bundle)
    sparse = {"GNU.sparse.map": f"0,{len(files[RECEIPTS])}", "GNU.sparse.realsize": str(1 << 20)}
    report = verify_bundle(rewrite(bundle, files, pax={RECEIPTS: sparse}))
    assert (
        not report.ok
        and report.reason == "bundle member 'receipts.jsonl' is a sparse file; none is"
    )


def test_small_members_are_limited_in_total_and_number(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each small file may be up to 64 MiB, so their sum and their number are bounded too
    (32 schema files of 64 MiB each made 2 GB of memory from a 2 MB bundle)."""
    monkeypatch.setattr(receipts.bundle_archive, "MAX_SMALL_TOTAL", 1 << 20)
    blob = b" " * (300 << 10)
    junk = {f"schemas/{i:064x}.json": blob for i in range(8)}
    report = verify_bundle(rewrite(bundle, {**read(bundle), **junk}))
    assert not report.ok, report
    assert "takes the members other than receipts.jsonl past their limit of 1 MiB" in report.reason
    monkeypatch.setattr(receipts.bundle_archive, "MAX_MEMBERS", 12)
    empty = {f"schemas/{i:064x}.json": b"" for i in range(8)}
    report = verify_bundle(rewrite(bundle, {**read(bundle), **empty}))
    assert not report.ok and report.reason == "the bundle has more than 12 members", report


def test_a_huge_pax_header_is_refused_while_it_is_read(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tarfile reads a PAX header whole into memory before any member check (a 2 GiB comment
    took 6 GB): the count of uncompressed bytes stops it at the limit."""
    monkeypatch.setattr(receipts.bundle_archive, "MAX_SMALL_TOTAL", 1 << 20)
    most = read_counter(monkeypatch)
    files = read(bundle)
    report = verify_bundle(rewrite(bundle, files, pax={MANIFEST: {"comment": "a" * (4 << 20)}}))
    assert not report.ok and report.reason.startswith("the first tar header runs past"), report
    assert most[0] <= (1 << 20) + 1, most


def test_a_key_id_that_is_not_a_string_fails_cleanly(bundle: Path, signer: Signer) -> None:
    """It crashed key_file() with an AttributeError, and `verify --json` printed nothing."""
    files = read(bundle)
    listing = json.loads(files["keys.json"])
    listing["keys"][0]["key_id"] = ["x"]
    files["keys.json"] = canonical_json(listing)
    report = verify_bundle(rewrite(bundle, files), signer.public_key_pem())
    assert not report.ok and report.reason == "keys.json: ['x'] is not a key id (ed25519: + 32 hex)"


@pytest.mark.parametrize(
    ("pem", "reason"),
    [
        (b"not a key", "bundle keys: "),
        (Signer.generate().public_key_pem().encode(), "does not match its public key"),
    ],
)
def test_a_bundle_whose_key_files_are_broken_fails_even_with_pinned_keys(
    bundle: Path, signer: Signer, pem: bytes, reason: str
) -> None:
    """Pinned, the bundle's keys were not read: a bundle with a garbage or swapped PEM file
    passed for its auditor and then failed for whoever it was handed on to."""
    files = read(bundle)
    files[key_file(signer.key_id)] = pem
    for pinned in (None, signer.public_key_pem()):
        report = verify_bundle(rewrite(bundle, files), pinned)
        assert not report.ok and reason in report.reason, report


@pytest.mark.parametrize("spelling", ["genuine + other key", "text + genuine"])
def test_a_key_file_holding_more_than_its_one_key_fails(
    bundle: Path, signer: Signer, spelling: str
) -> None:
    """The PEM reader took the first block and ignored the rest: a file could carry a second
    key (or text) that another reader takes, so one bundle held two key sets."""
    files = read(bundle)
    name = key_file(signer.key_id)
    other = Signer.generate().public_key_pem().encode()
    pem = files[name] + other if spelling == "genuine + other key" else b"note\n" + files[name]
    for pinned in (None, signer.public_key_pem()):
        report = verify_bundle(rewrite(bundle, {**files, name: pem}), pinned)
        assert not report.ok
        assert report.reason == f"bundle keys: {name} holds more than its one public key"


def test_a_key_file_keys_json_does_not_list_fails(bundle: Path, signer: Signer) -> None:
    """A bundle is written with exactly its listed keys: an extra PEM, listed in the manifest,
    passed unexamined and was handed on as evidence."""
    stray = Signer.generate()
    files = {**read(bundle), key_file(stray.key_id): stray.public_key_pem().encode()}
    for pinned in (None, signer.public_key_pem()):
        report = verify_bundle(rewrite(bundle, files), pinned)
        assert not report.ok
        assert report.reason == (
            f"bundle member {key_file(stray.key_id)!r} is a key keys.json does not list"
        )


def test_a_key_keys_json_lists_twice_or_under_another_file_fails(
    bundle: Path, signer: Signer
) -> None:
    """A repeated entry (its ranges merged) or a `file` that is not the key's own passed."""
    files = read(bundle)
    listing = json.loads(files["keys.json"])
    entry = listing["keys"][0]
    twice = {"keys": [entry, {**entry, "ranges": []}]}
    other = "keys/ed25519_" + "0" * 32 + ".pem"
    elsewhere = {"keys": [{**entry, "file": other}]}
    wrong_file = (
        f"keys.json names {other!r} as {signer.key_id}'s file, not {key_file(signer.key_id)}"
    )
    for changed, reason in [
        (twice, f"keys.json lists {signer.key_id} twice"),
        (elsewhere, wrong_file),
    ]:
        tampered = rewrite(bundle, {**files, "keys.json": canonical_json(changed)})
        report = verify_bundle(tampered, signer.public_key_pem())
        assert not report.ok and report.reason == reason, report


def test_an_unexpected_error_is_a_failed_report_for_users_and_raises_in_tests(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(contents: object) -> None:
        raise KeyError("a check that hostile input surprised")

    monkeypatch.setattr(receipts.bundle_verify, "_schemas", broken)
    with pytest.raises(KeyError):  # the suite's setting (tests/conftest.py): bugs stay visible
        verify_bundle(bundle)
    monkeypatch.setattr(receipts.bundle_verify, "CONTAIN_UNEXPECTED", True)  # what users run
    report = verify_bundle(bundle)
    assert not report.ok and report.reason.startswith("the verifier cannot process this bundle")
    assert "KeyError" in report.reason and "bug in callproof" in report.reason
    assert "Traceback" in caplog.text  # the bug is logged, not hidden


@pytest.mark.parametrize(
    "name",
    [MANIFEST, "checkpoint.json", "keys.json", "proofs.json", f"schemas/{UNION_HASH}.json"],
)
def test_a_json_file_that_repeats_a_key_fails(bundle: Path, signer: Signer, name: str) -> None:
    """Python keeps a repeated key's last value, other readers its first: two verifiers could
    read two checkpoints from one file. Even a repeat with the same value is refused."""
    files = read(bundle)
    files[name] = files[name][:-1] + b"," + files[name][1:]  # {"a":1} -> {"a":1,"a":1}
    report = verify_bundle(
        rewrite(bundle, files, fix_manifest=name != MANIFEST), signer.public_key_pem()
    )
    assert not report.ok and report.reason.startswith(f"{name}: the key "), report
    assert "appears twice in one object" in report.reason


@pytest.mark.parametrize("field", ["receipts", "first_seq", "last_seq"])
def test_a_manifest_count_of_true_is_not_one(
    tmp_path: Path, chain: list[Receipt], signer: Signer, field: str
) -> None:
    one = export(tmp_path / "one.tar.gz", chain[:1], signer)
    assert verify_bundle(one, signer.public_key_pem()).ok
    files = read(one)
    files[MANIFEST] = canonical_json({**json.loads(files[MANIFEST]), field: True})
    report = verify_bundle(rewrite(one, files, fix_manifest=False), signer.public_key_pem())
    assert not report.ok and report.reason == f"{MANIFEST}: {field} must be an integer, not True"


def test_a_tar_header_tarfile_cannot_parse_is_an_unreadable_bundle(bundle: Path) -> None:
    """tarfile raises ValueError, not a TarError, on a GNU sparse map that is not numbers."""
    files = read(bundle)
    report = verify_bundle(rewrite(bundle, files, pax={RECEIPTS: {"GNU.sparse.map": "a,b"}}))
    assert not report.ok and report.reason.startswith("not a readable .tar.gz bundle"), report


def archive_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the verifier has opened the archive (one item, updated)."""
    opened = [0]
    archive = receipts.bundle_archive._archive

    def counted(path: Path) -> Any:
        opened[0] += 1
        return archive(path)

    monkeypatch.setattr(receipts.bundle_archive, "_archive", counted)
    return opened


def test_receipts_are_decompressed_once_in_the_writers_order_twice_in_another(
    bundle: Path, signer: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_bundle puts receipts.jsonl last, so it is checked and hashed in the one pass
    (reading it twice cost 12% of bench.verify); a bundle packed with receipts.jsonl before
    the files needed to check it still verifies, from a second pass."""
    opened = archive_reads(monkeypatch)
    assert verify_bundle(bundle, signer.public_key_pem()).ok
    assert opened == [1]
    files = read(bundle)
    receipts_first = rewrite(bundle, {RECEIPTS: files[RECEIPTS], **files})
    opened[0] = 0
    assert verify_bundle(receipts_first, signer.public_key_pem()).ok
    assert opened == [2]


def test_a_member_after_the_receipts_is_read_and_held_to_the_manifest(
    bundle: Path, signer: Signer
) -> None:
    """In the one pass, the members after receipts.jsonl are read once the receipts are
    checked: one the manifest does not list still fails the bundle."""
    stray = {f"schemas/{'0' * 64}.json": b"{}"}
    report = verify_bundle(
        rewrite(bundle, {**read(bundle), **stray}, fix_manifest=False), signer.public_key_pem()
    )
    assert not report.ok
    assert report.reason == f"bundle file schemas/{'0' * 64}.json is not listed in {MANIFEST}"


def test_the_receipts_hashed_on_the_way_are_held_to_the_manifest(bundle: Path) -> None:
    files = read(bundle)
    manifest = json.loads(files[MANIFEST])
    manifest["files"][RECEIPTS] = hashlib.sha256(files[RECEIPTS] + b"\n").hexdigest()
    files[MANIFEST] = canonical_json(manifest)
    report = verify_bundle(rewrite(bundle, files, fix_manifest=False))
    assert not report.ok and report.checked == N
    assert report.reason == f"bundle file {RECEIPTS} does not match its SHA-256 in {MANIFEST}"


# What a mutation review found no test pinned (each check below was removable unnoticed).


def _with_manifest(files: dict[str, bytes], **changes: Any) -> dict[str, bytes]:
    manifest = json.loads(files[MANIFEST])
    manifest.update(changes)
    return {**files, MANIFEST: canonical_json(manifest)}


def _repack(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A bundle archive holding exactly ``members``, in that order (names may repeat)."""
    with gzip.open(path, "wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_manifest_relabelled_to_another_chain_fails(bundle: Path, signer: Signer) -> None:
    """The receipts say which chain they are of; the unsigned manifest may not say another,
    whether or not the reader names the chain it expects."""
    relabelled = rewrite(bundle, _with_manifest(read(bundle), chain="globex"))
    assert not verify_bundle(relabelled, signer.public_key_pem()).ok
    assert not verify_bundle(relabelled, signer.public_key_pem(), chain="globex").ok


def test_a_manifest_without_its_file_hashes_or_listing_a_missing_file_fails(
    bundle: Path, signer: Signer
) -> None:
    files = read(bundle)
    manifest = json.loads(files[MANIFEST])
    del manifest["files"]
    bare = rewrite(bundle, {**files, MANIFEST: canonical_json(manifest)}, fix_manifest=False)
    report = verify_bundle(bare, signer.public_key_pem())
    assert not report.ok and "lists no file hashes" in report.reason, report
    manifest = json.loads(files[MANIFEST])
    manifest["files"]["schemas/" + "ab" * 32 + ".json"] = "00" * 32
    listed = rewrite(bundle, {**files, MANIFEST: canonical_json(manifest)}, fix_manifest=False)
    report = verify_bundle(listed, signer.public_key_pem())
    assert not report.ok and "missing" in report.reason, report


def test_a_manifest_of_another_format_fails(bundle: Path, signer: Signer) -> None:
    other = rewrite(bundle, _with_manifest(read(bundle), format="something-else"))
    report = verify_bundle(other, signer.public_key_pem())
    assert not report.ok and "does not describe" in report.reason, report


def test_bytes_after_the_last_receipt_line_fail(bundle: Path, signer: Signer) -> None:
    """Junk after the last newline, with its hash in the manifest and the count unchanged, is
    not a line to skip."""
    files = read(bundle)
    data = files[RECEIPTS] + b"junk"
    manifest = json.loads(files[MANIFEST])
    manifest["files"][RECEIPTS] = hashlib.sha256(data).hexdigest()
    files = {**files, MANIFEST: canonical_json(manifest), RECEIPTS: data}
    assert not verify_bundle(rewrite(bundle, files, fix_manifest=False), signer.public_key_pem()).ok


def test_a_last_receipt_line_without_its_newline_fails(bundle: Path, signer: Signer) -> None:
    """Each line is JCS(receipt) and a newline; without the last one the file has a second
    spelling, and it verified."""
    files = read(bundle)
    cut = rewrite(bundle, {**files, RECEIPTS: files[RECEIPTS][:-1]})
    for workers in (1, 2):
        report = verify_bundle(cut, signer.public_key_pem(), workers=workers)
        assert not report.ok and report.first_failure_seq == N and report.checked == N - 1
        assert report.reason == f"the last line of {RECEIPTS} does not end with a newline"


def test_a_range_bundle_without_receipts_fails(bundle: Path, chain, signer: Signer) -> None:
    files = read(bundle)
    tree = MerkleTree.from_entry_hashes(r.entry_hash for r in chain)
    proofs = json.loads(files["proofs.json"])
    proofs["right"] = [h.hex() for h in tree.compact_range(0, N)]
    files = _with_manifest(files, first_seq=1, last_seq=0)
    files = {**files, RECEIPTS: b"", "proofs.json": canonical_json(proofs)}
    report = verify_bundle(rewrite(bundle, files), signer.public_key_pem(), allow_range=True)
    assert not report.ok and "no receipts" in (report.reason or ""), report


def test_a_second_receipts_member_fails(bundle: Path, signer: Signer, tmp_path: Path) -> None:
    """Two receipts.jsonl members: the verifier would read the first, `tar x` keeps the last."""
    files = read(bundle)
    edited = files[RECEIPTS].replace(b'"valid":true', b'"valid":false', 1)
    assert edited != files[RECEIPTS]
    manifest = json.loads(files[MANIFEST])
    manifest["files"][RECEIPTS] = hashlib.sha256(edited).hexdigest()
    members = [(MANIFEST, canonical_json(manifest))]
    members += [(n, d) for n, d in files.items() if n not in (MANIFEST, RECEIPTS)]
    members += [(RECEIPTS, files[RECEIPTS]), (RECEIPTS, edited)]
    report = verify_bundle(_repack(tmp_path / "twice.tar.gz", members), signer.public_key_pem())
    assert not report.ok and "appears twice" in report.reason, report


def test_data_after_the_archives_end_fails_its_zero_padding_does_not(
    bundle: Path, signer: Signer, tmp_path: Path
) -> None:
    """tarfile stopped at the end-of-archive marker; `tar -xzif` reads on and extracted the
    checkpoint.json of a second archive appended after it, in the gzip member or a new one."""
    files = read(bundle)
    inner = gzip.decompress(bundle.read_bytes())
    other = io.BytesIO()
    with tarfile.open(fileobj=other, mode="w") as tar:
        info = tarfile.TarInfo("checkpoint.json")
        info.size = len(files["checkpoint.json"])
        tar.addfile(info, io.BytesIO(files["checkpoint.json"]))
    cases = {
        "padded.tar.gz": (gzip.compress(inner + bytes(20_000)), True),
        "appended.tar.gz": (gzip.compress(inner + other.getvalue()), False),
        "member.tar.gz": (bundle.read_bytes() + gzip.compress(other.getvalue()), False),
        "junk.tar.gz": (gzip.compress(inner + b"\0" * 512 + b"x"), False),
    }
    for name, (data, ok) in cases.items():
        (tmp_path / name).write_bytes(data)
        report = verify_bundle(tmp_path / name, signer.public_key_pem())
        assert report.ok is ok, (name, report)
        assert ok or "data after its tar archive's end" in report.reason, (name, report)


def test_an_absolute_member_name_fails(bundle: Path, signer: Signer, tmp_path: Path) -> None:
    files = read(bundle)
    members = [("/" + n if n == "checkpoint.json" else n, d) for n, d in files.items()]
    report = verify_bundle(_repack(tmp_path / "absolute.tar.gz", members), signer.public_key_pem())
    assert not report.ok and "unexpected bundle member" in report.reason, report
