"""Chain verification, in memory: every tamper case is detected and named at the right seq."""

from __future__ import annotations

import base64
import copy
import itertools
from typing import Any

import pytest
import rfc8785
from receipt_samples import SCHEMAS, UNION, UNION_HASH, build_chain, digest, draft

from receipts.chain import verify_receipts
from receipts.checkpoint import checkpoint_problem, make_checkpoint
from receipts.errors import ReceiptFormatError
from receipts.merkle import MerkleTree
from receipts.record import BODY_FIELDS, GENESIS_PREV_HASH, Receipt, entry_hash_of
from receipts.seal import seal
from receipts.signing import KeyRange, KeyRing, Signer

N = 12


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture(scope="module")
def ring(signer: Signer) -> KeyRing:
    ring = KeyRing()
    ring.add(signer.public_key)
    return ring


@pytest.fixture(scope="module")
def chain(signer: Signer) -> list[Receipt]:
    return build_chain(signer, N)


def objs(chain: list[Receipt]) -> list[dict[str, Any]]:
    return [copy.deepcopy(r.to_json_obj()) for r in chain]


def checkpoint_of(chain: list[Receipt], signer: Signer, size: int | None = None) -> dict:
    size = len(chain) if size is None else size
    tree = MerkleTree.from_entry_hashes(r.entry_hash for r in chain[:size])
    return make_checkpoint(chain[0].chain, size, tree.root().hex(), signer)


def resign(obj: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """What an attacker holding `signer` would do: fix key_id, entry_hash and signature."""
    obj["key_id"] = signer.key_id
    obj["entry_hash"] = entry_hash_of({k: obj[k] for k in BODY_FIELDS})
    obj["signature"] = base64.b64encode(signer.sign(bytes.fromhex(obj["entry_hash"]))).decode()
    return obj


def verify(receipts, ring, **kw):
    kw.setdefault("schemas", SCHEMAS)
    return verify_receipts(receipts, ring, **kw)


def test_entry_hash_is_sha256_of_rfc8785_body(chain: list[Receipt]) -> None:
    r = chain[0]
    assert r.entry_hash == digest_bytes(rfc8785.dumps(r.body()))
    assert r.prev_hash == GENESIS_PREV_HASH and r.seq == 1
    assert all(b.prev_hash == a.entry_hash for a, b in itertools.pairwise(chain))


def digest_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_intact_chain_verifies_with_checkpoint(chain, ring, signer) -> None:
    report = verify(chain, ring, checkpoint=checkpoint_of(chain, signer))
    assert report.ok, report
    assert report.checked == N and report.first_failure_seq is None
    assert report.tree_size == N and report.chain == "acme"


def test_round_trip_through_json_objects(chain, ring) -> None:
    assert verify(objs(chain), ring).ok
    assert [Receipt.from_json_obj(o) for o in objs(chain)] == chain


def test_edited_field_is_caught_at_its_seq(chain, ring) -> None:
    receipts = objs(chain)
    receipts[4]["output"]["tool_calls"][0]["arguments"]["city"] = "Atlantis"
    report = verify(receipts, ring)
    assert (report.ok, report.first_failure_seq) == (False, 5)
    assert "entry_hash" in report.reason


def test_edit_with_recomputed_hash_fails_the_signature(chain, ring) -> None:
    receipts = objs(chain)
    receipts[6]["usage"]["completion_tokens"] = 1
    receipts[6]["entry_hash"] = entry_hash_of({k: receipts[6][k] for k in BODY_FIELDS})
    report = verify(receipts, ring)
    assert report.first_failure_seq == 7 and "signature" in report.reason


B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def test_a_signature_has_one_spelling(chain, ring, signer) -> None:
    """The last character of a 64-byte signature's base64 carries 4 padding bits that a
    lenient decoder ignores: flipping them respells the receipt without breaking it."""
    receipts = objs(chain)
    signature = receipts[3]["signature"]
    last = B64.index(signature[-3])  # then "=="
    respelled = signature[:-3] + B64[last ^ 1] + "=="
    assert base64.b64decode(respelled) == base64.b64decode(signature)
    receipts[3]["signature"] = respelled
    report = verify(receipts, ring)
    assert report.first_failure_seq == 4 and "canonical base64" in report.reason
    cp = checkpoint_of(chain, signer)
    cp["signature"] = cp["signature"][:-3] + B64[B64.index(cp["signature"][-3]) ^ 1] + "=="
    assert (
        checkpoint_problem(cp, ring) == "checkpoint signature is not 64 bytes in canonical base64"
    )


def test_deleted_receipt(chain, ring) -> None:
    receipts = objs(chain)
    del receipts[3]
    report = verify(receipts, ring)
    assert report.first_failure_seq == 4 and "missing" in report.reason


def test_swapped_receipts(chain, ring) -> None:
    receipts = objs(chain)
    receipts[5], receipts[6] = receipts[6], receipts[5]
    assert verify(receipts, ring).first_failure_seq == 6


def test_inserted_forged_receipt(chain, ring) -> None:
    attacker = Signer.generate()
    forged = seal(draft(city="Forged"), seq=3, prev_hash=chain[1].entry_hash, signer=attacker)
    receipts = chain[:2] + [forged] + chain[2:]
    report = verify(receipts, ring)
    assert report.first_failure_seq == 3 and "unknown key" in report.reason


def test_receipt_resigned_with_another_key(chain, ring) -> None:
    receipts = objs(chain)
    receipts[8]["output"]["tool_calls"][0]["arguments"]["city"] = "Elsewhere"
    resign(receipts[8], Signer.generate())
    report = verify(receipts, ring)
    assert report.first_failure_seq == 9 and "unknown key" in report.reason


def test_retired_key_cannot_sign_outside_its_range(chain, signer) -> None:
    retired_ring = KeyRing()
    retired_ring.add(signer.public_key, [KeyRange("acme", 1, 5)])
    report = verify(chain, retired_ring)
    assert report.first_failure_seq == 6 and "out of range" in report.reason


def test_rotation_mid_ledger_verifies(signer) -> None:
    new = Signer.generate()
    receipts = build_chain(signer, 5)
    prev = receipts[-1].entry_hash
    for seq in range(6, 11):
        receipts.append(seal(draft(city=f"c{seq}"), seq=seq, prev_hash=prev, signer=new))
        prev = receipts[-1].entry_hash
    ring = KeyRing.from_public_keys(
        [
            {
                "public_key_pem": signer.public_key_pem(),
                "ranges": [{"chain": "acme", "first_seq": 1, "last_seq": 5}],
            },
            {
                "public_key_pem": new.public_key_pem(),
                "ranges": [{"chain": "acme", "first_seq": 6, "last_seq": None}],
            },
        ]
    )
    tree = MerkleTree.from_entry_hashes(r.entry_hash for r in receipts)
    cp = make_checkpoint("acme", 10, tree.root().hex(), new)
    assert verify(receipts, ring, checkpoint=cp).ok


def test_truncated_tail_against_saved_checkpoint(chain, ring, signer) -> None:
    saved = checkpoint_of(chain, signer)
    report = verify(chain[:9], ring, checkpoint=saved)
    assert report.first_failure_seq == 10 and "truncated" in report.reason


def test_older_checkpoint_is_checked_mid_chain(chain, ring, signer) -> None:
    assert verify(chain, ring, checkpoint=checkpoint_of(chain, signer, 7)).ok


def test_checkpoints_the_verifier_saved_are_each_checked(chain, ring, signer) -> None:
    """Beside the latest checkpoint: the receipts must pass through every saved root, so a
    history rewritten (or cut back) since a checkpoint was saved fails even when the
    current checkpoint was re-made to match the rewrite."""
    saved = [checkpoint_of(chain, signer, 4), checkpoint_of(chain, signer, 7)]
    assert verify(chain, ring, checkpoint=checkpoint_of(chain, signer), saved=saved).ok
    assert verify(chain, ring, saved=saved).ok  # a saved one alone: no current checkpoint
    fork = chain[:5] + build_chain(signer, N)[5:]  # seq 6 on rewritten, re-signed
    relinked = objs(fork)
    for prev, obj in itertools.pairwise(relinked):  # the attacker fixes every link after it
        obj["prev_hash"] = prev["entry_hash"]
        resign(obj, signer)
    resealed = [Receipt.from_json_obj(o) for o in relinked]
    current = checkpoint_of(resealed, signer)  # a checkpoint made after the rewrite
    assert verify(resealed, ring, checkpoint=current).ok  # what the rewrite alone shows
    report = verify(resealed, ring, checkpoint=current, saved=saved)
    assert report.first_failure_seq == 7 and "does not match the saved checkpoint" in report.reason
    report = verify(chain[:6], ring, saved=saved)
    assert report.first_failure_seq == 7 and "truncated since it was saved" in report.reason
    other = make_checkpoint("globex", 4, saved[0]["root_hash"], signer)
    assert "for chain 'globex'" in verify(chain, ring, saved=[other]).reason
    # Past the chain's end, a checkpoint's size is believed only once it is the chain's own
    # and signed: "truncated" blamed the ledger for another tenant's or a forged checkpoint.
    beyond = make_checkpoint("globex", 999, saved[0]["root_hash"], signer)
    assert "for chain 'globex'" in verify(chain, ring, saved=[beyond]).reason
    forged = {**make_checkpoint("acme", 999, saved[0]["root_hash"], signer), "signature": "AA=="}
    reason = verify(chain, ring, saved=[forged]).reason
    assert "saved checkpoint at tree size 999" in reason and "truncated" not in reason, reason


def test_rewritten_history_does_not_match_the_checkpoint(chain, ring, signer) -> None:
    fork = build_chain(signer, N)  # validly signed, but not the history that was checkpointed
    report = verify(fork, ring, checkpoint=checkpoint_of(chain, signer))
    assert report.first_failure_seq == N and "Merkle root" in report.reason


def test_forged_checkpoint_is_refused(chain, ring, signer) -> None:
    cp = checkpoint_of(chain, signer)
    cp["tree_size"] = N - 1
    assert checkpoint_problem(cp, ring) == "checkpoint signature does not verify"
    report = verify(chain, ring, checkpoint=cp)
    assert not report.ok and report.first_failure_seq is None and "checkpoint" in report.reason


def test_edited_stored_schema(chain, ring) -> None:
    edited = copy.deepcopy(UNION)
    edited["oneOf"][0]["properties"]["arguments"]["properties"]["city"]["maxLength"] = 3
    report = verify(chain, ring, schemas={UNION_HASH: edited})
    assert report.first_failure_seq == 1 and "edited" in report.reason


def test_missing_schema(chain, ring) -> None:
    report = verify(chain, ring, schemas=lambda h: None)
    assert report.first_failure_seq == 1 and "missing" in report.reason


def test_arguments_outside_the_bound_schema(signer, ring) -> None:
    receipts = build_chain(signer, 3)
    bad = seal(
        draft(city="Paris", days=99), seq=4, prev_hash=receipts[-1].entry_hash, signer=signer
    )  # days maximum is 14; sealed by a buggy but trusted writer
    report = verify(receipts + [bad], ring)
    assert report.first_failure_seq == 4 and "days" in report.reason


def test_manifest_hash_must_match_manifest(chain, ring, signer) -> None:
    receipts = objs(chain)
    receipts[1]["manifest"]["model"] = "a-bigger-model"
    resign(receipts[1], signer)
    report = verify(receipts, ring)
    assert report.first_failure_seq == 2 and "manifest_hash" in report.reason


def test_malformed_receipt_is_named(chain, ring) -> None:
    receipts = objs(chain)
    receipts[2]["seq"] = "3"
    report = verify(receipts, ring)
    assert report.first_failure_seq == 3 and "malformed" in report.reason


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("tenant", lambda r: r.update(tenant="someone-else")),
        ("output.tool_calls", lambda r: r["output"].update(tool_calls=[])),
        ("output.tool_calls", lambda r: r["output"].update(kind="text")),
        (
            "validation.valid",
            lambda r: (
                r["output"]["tool_calls"][0].update(arguments={"evil": 1}),
                r["validation"].update(valid=False, errors=["anything"]),
            ),
        ),
    ],
    ids=[
        "tenant-not-chain",
        "tool-calls-kind-without-calls",
        "text-kind-with-calls",
        "calls-with-a-false-verdict",
    ],
)
def test_a_resigned_receipt_whose_fields_disagree_is_malformed(
    chain, ring, signer, field, change
) -> None:
    """A signer's key does not make a receipt consistent: its tenant names its chain, its
    output lists calls exactly when its kind says it is tool calls, and calls carry a true
    verdict (a false one exempted them from the schema check, so any arguments passed)."""
    receipts = objs(chain)
    assert receipts[3]["output"]["kind"] == "tool_calls" and receipts[3]["output"]["tool_calls"]
    change(receipts[3])
    resign(receipts[3], signer)
    report = verify(receipts, ring)
    assert report.first_failure_seq == 4 and field in report.reason, report


def test_range_verifies_with_left_compact_range(chain, ring, signer) -> None:
    tree = MerkleTree.from_entry_hashes(r.entry_hash for r in chain)
    report = verify(
        chain[4:9],
        ring,
        start_seq=5,
        expected_prev_hash=chain[3].entry_hash,
        checkpoint=checkpoint_of(chain, signer),
        left=tree.compact_range(0, 4),
        right=tree.compact_range(9, N),
    )
    assert report.ok and report.checked == 5, report
    wrong_prev = verify(chain[4:9], ring, start_seq=5, expected_prev_hash=chain[2].entry_hash)
    assert wrong_prev.first_failure_seq == 5


def test_report_json(chain, ring) -> None:
    report = verify(chain[:2], ring)
    assert report.to_json_obj()["checked"] == 2 and report.to_json_obj()["ok"] is True


def test_bad_drafts_fail_fast() -> None:
    good = draft()
    with pytest.raises(ReceiptFormatError, match="call_"):
        type(good)(
            **{
                **good.__dict__,
                "output": {
                    **good.output,
                    "tool_calls": [{**good.output["tool_calls"][0], "id": "call_x"}],
                },
            }
        )
    with pytest.raises(ReceiptFormatError, match="schema"):
        type(good)(**{**good.__dict__, "schema": {"type": "object"}})
    with pytest.raises(ReceiptFormatError, match="genesis"):
        seal(good, seq=1, prev_hash=digest("x"), signer=Signer.generate())
    # A link id the database column cannot hold is refused with its draft, not in the batch.
    for odd in ("x" * 65, "a\x00b", ""):
        with pytest.raises(ReceiptFormatError, match="links\\[0\\].tool_call_id"):
            type(good)(**{**good.__dict__, "links": [{"tool_call_id": odd, "receipt_id": None}]})
    type(good)(**{**good.__dict__, "links": [{"tool_call_id": "x" * 64, "receipt_id": None}]})


def test_worked_example_in_the_spec_verifies() -> None:
    """docs/receipt-format.md's worked example: real values, verified by this implementation."""
    import hashlib
    import json
    import re
    from pathlib import Path

    from receipts.canonical import canonical_json
    from receipts.merkle import leaf_hash, node_hash

    spec = (Path(__file__).resolve().parents[2] / "docs" / "receipt-format.md").read_text()
    blocks = dict(re.findall(r"<!-- example:(\w+) -->\n```\w+\n(.*?)\n```", spec, re.DOTALL))
    schema = json.loads(blocks["schema"])
    r1, r2 = json.loads(blocks["receipt1"]), json.loads(blocks["receipt2"])
    checkpoint = json.loads(blocks["checkpoint"])
    ring = KeyRing()
    ring.add_pem(blocks["public_key"])
    schema_hash = hashlib.sha256(canonical_json(schema)).hexdigest()
    report = verify_receipts([r1, r2], ring, schemas={schema_hash: schema}, checkpoint=checkpoint)
    assert report.ok and report.tree_size == 2, report
    root = node_hash(
        leaf_hash(bytes.fromhex(r1["entry_hash"])), leaf_hash(bytes.fromhex(r2["entry_hash"]))
    )
    assert checkpoint["root_hash"] == root.hex()
    assert f"root   = H(0x01 || leaf 0 || leaf 1)\n       = {root.hex()}" in spec


def test_binding_finds_tools_under_defs_and_refuses_unknown_tools(signer, ring) -> None:
    """The parallel-calls union keeps each call branch in $defs and refers to it; arguments
    are validated against the branch with the union as the root, so refs resolve."""
    from receipts.manifest import build_manifest, schema_hash

    weather = UNION["oneOf"][0]
    union = {
        "anyOf": [
            {"$ref": "#/$defs/call-get_weather"},
            {
                "type": "object",
                "properties": {
                    "tool_calls": {"type": "array", "items": {"$ref": "#/$defs/call-get_weather"}}
                },
            },
        ],
        "$defs": {"call-get_weather": weather},
    }
    good = draft(city="Oslo")
    manifest = build_manifest(**{**good.manifest, "schema_hash": schema_hash(union)})
    base = {**good.__dict__, "manifest": manifest, "schema": union}
    ok = seal(type(good)(**base), seq=1, prev_hash=GENESIS_PREV_HASH, signer=signer)
    schemas = {schema_hash(union): union}
    assert verify_receipts([ok], ring, schemas=schemas).ok
    bad_call = {**good.output["tool_calls"][0], "arguments": {"city": "Oslo", "unit": "kelvin"}}
    bad = seal(
        type(good)(**{**base, "output": {**good.output, "tool_calls": [bad_call]}}),
        seq=1,
        prev_hash=GENESIS_PREV_HASH,
        signer=signer,
    )
    assert "unit" in verify_receipts([bad], ring, schemas=schemas).reason
    unknown = {**good.output["tool_calls"][0], "name": "delete_everything"}
    stray = seal(
        type(good)(**{**base, "output": {**good.output, "tool_calls": [unknown]}}),
        seq=1,
        prev_hash=GENESIS_PREV_HASH,
        signer=signer,
    )
    assert "not in the bound schema" in verify_receipts([stray], ring, schemas=schemas).reason


def test_binding_never_fetches_a_remote_ref() -> None:
    """A bound schema that points outside itself is refused offline, with the reason."""
    from receipts.binding import SchemaBinding
    from receipts.manifest import schema_hash

    remote = {"anyOf": [{"$ref": "https://example.com/tools.json"}]}
    binding = SchemaBinding({schema_hash(remote): remote})
    manifest = {"schema_hash": schema_hash(remote)}
    output = {"tool_calls": [{"id": "call_" + "0" * 24, "name": "x", "arguments": {}}]}
    reason = binding.problem(manifest, output, {"valid": True, "errors": []})
    assert reason is not None and "not a valid JSON schema" in reason
    assert "Retrieval is disabled" in reason


def test_binding_reads_every_schema_as_2020_12_whatever_its_dollar_schema_says() -> None:
    """A response_format schema keeps its `$schema`; the verifier followed it: a URL an agent
    chose was fetched by every verifier, and the chain failed at that receipt for good (the
    URL named no metaschema it knew). Now it is read as the gateway read it, offline."""
    import socket

    from receipts.binding import SchemaBinding
    from receipts.manifest import schema_hash

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        meta = f"http://127.0.0.1:{listener.getsockname()[1]}/meta"
        for declared in (meta, "http://json-schema.org/draft-07/schema#", "file:///etc/hosts"):
            params = {"type": "object", "properties": {"a": {"type": "integer"}}}
            branch = {"properties": {"tool": {"const": "f"}, "arguments": params}}
            bound = {"$schema": declared, "anyOf": [branch]}
            binding = SchemaBinding({schema_hash(bound): bound})
            call = {"id": "call_" + "0" * 24, "name": "f", "arguments": {"a": 1}}
            manifest = {"schema_hash": schema_hash(bound)}
            assert binding.problem(manifest, {"tool_calls": [call]}, {"valid": True}) is None
            wrong = {**call, "arguments": {"a": "x"}}
            reason = SchemaBinding({schema_hash(bound): bound}).problem(
                manifest, {"tool_calls": [wrong]}, {"valid": True}
            )
            assert reason is not None and "do not validate" in reason, (declared, reason)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody called


def test_binding_names_a_subschema_it_cannot_compile_and_survives_deep_values() -> None:
    """A Python-only pattern (not ECMA-262) is reported where it is, not as a missing tool;
    arguments nested deeper than the validator reports still fail with a reason."""
    from receipts.binding import SchemaBinding
    from receipts.manifest import schema_hash

    def union(params: dict) -> dict:
        branch = {"properties": {"tool": {"const": "f"}, "arguments": params}}
        return {"anyOf": [branch]}

    call = {"id": "call_" + "0" * 24, "name": "f", "arguments": {"a": "x"}}
    python_only = union({"properties": {"a": {"type": "string", "pattern": "x\\Z"}}})
    binding = SchemaBinding({schema_hash(python_only): python_only})
    reason = binding.problem(
        {"schema_hash": schema_hash(python_only)}, {"tool_calls": [call]}, {"valid": True}
    )
    assert reason is not None and "cannot be compiled at #/anyOf/0/properties/arguments" in reason

    integer = union({"properties": {"a": {"type": "integer"}}})
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    binding = SchemaBinding({schema_hash(integer): integer})
    reason = binding.problem(
        {"schema_hash": schema_hash(integer)},
        {"tool_calls": [{**call, "arguments": {"a": deep}}]},
        {"valid": True},
    )
    assert reason is not None and "do not validate" in reason


def test_binding_names_the_failing_value_by_an_escaped_json_pointer() -> None:
    """A property named "a/b~c" is "/a~1b~0c" in the reason (RFC 6901), not a path that
    points somewhere else."""
    from receipts.binding import SchemaBinding
    from receipts.manifest import schema_hash

    params = {"properties": {"a/b~c": {"type": "integer"}}}
    bound = {"anyOf": [{"properties": {"tool": {"const": "f"}, "arguments": params}}]}
    call = {"id": "call_" + "0" * 24, "name": "f", "arguments": {"a/b~c": "x"}}
    reason = SchemaBinding({schema_hash(bound): bound}).problem(
        {"schema_hash": schema_hash(bound)}, {"tool_calls": [call]}, {"valid": True}
    )
    assert reason is not None and reason.endswith("(at /a~1b~0c)")


def test_the_manifest_memo_keeps_digests_and_forgets_the_least_recently_used() -> None:
    """A bundle of many distinct large manifests (1,500 receipts of 1 MiB manifests took
    1.6 GB): the memo keeps a digest and a hash per manifest, and at most MANIFEST_MEMO."""
    import tracemalloc

    from receipts.chain import MANIFEST_MEMO, ReceiptChecker
    from receipts.manifest import manifest_hash

    checker = ReceiptChecker(KeyRing(), {})
    pad = "a" * 100_000
    manifests = [{"sampling": {"pad": pad, "n": n}} for n in range(MANIFEST_MEMO + 50)]
    tracemalloc.start()
    try:
        for manifest in manifests:
            assert checker._manifest_hash(manifest) == manifest_hash(manifest)
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert retained < 1 << 20, retained  # the texts were ~100 MB
    assert checker._manifest_hash(manifests[0]) == manifest_hash(manifests[0])  # evicted, redone


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-99-99T99:99:99.000000Z",  # every field out of range
        "\u0662\u0660\u0662\u0666-11-21T23:15:00.123456Z",  # Arabic-Indic digits match \d
        "2026-02-30T00:00:00.000000Z",  # a day February lacks
        "2025-02-29T00:00:00.000000Z",  # nor in a common year
        "0000-01-01T00:00:00.000000Z",  # no year 0
    ],
)
def test_a_timestamp_is_ascii_digits_naming_a_real_moment(chain, stamp: str) -> None:
    obj = chain[0].to_json_obj()
    obj["created_at"] = stamp
    with pytest.raises(ReceiptFormatError, match="created_at"):
        Receipt.from_json_obj(obj)
    with pytest.raises(ReceiptFormatError, match="timestamp"):
        make_checkpoint("acme", 1, "00" * 32, Signer.generate(), timestamp=stamp)


def test_a_saved_checkpoint_outside_a_range_is_checked_by_consistency(chain, ring, signer) -> None:
    """A range that ends before a saved checkpoint's size, or starts after it, cannot reach
    its root from its own leaves; a consistency proof between the saved size and the edge of
    the range (what a verifier holding the whole tree supplies) checks it instead. Without
    one the range reads as cut short, as a bundle's must."""
    tree = MerkleTree.from_entry_hashes(r.entry_hash for r in chain)
    saved = checkpoint_of(chain, signer, 6)
    head = verify(
        chain[:3], ring, saved=[saved], consistency={(3, 6): tree.consistency_proof(3, 6)}
    )
    assert head.ok and head.checked == 3, head
    tail = verify(
        chain[8:],
        ring,
        start_seq=9,
        expected_prev_hash=chain[7].entry_hash,
        checkpoint=checkpoint_of(chain, signer),
        left=tree.compact_range(0, 8),
        saved=[saved],
        consistency={(6, 8): tree.consistency_proof(6, 8)},
    )
    assert tail.ok and tail.checked == N - 8, tail
    assert "truncated since it was saved" in verify(chain[:3], ring, saved=[saved]).reason
    rewritten = make_checkpoint("acme", 6, tree.root(5).hex(), signer)  # another history
    report = verify(
        chain[:3], ring, saved=[rewritten], consistency={(3, 6): tree.consistency_proof(3, 6)}
    )
    assert not report.ok and "saved checkpoint at tree size 6" in report.reason, report
    bent = verify(
        chain[:3], ring, saved=[saved], consistency={(3, 6): tree.consistency_proof(2, 6)}
    )
    assert not bent.ok and "saved checkpoint at tree size 6" in bent.reason, bent


def test_a_checkpoint_of_another_chain_says_so(chain, ring, signer) -> None:
    """Under a keyring that records the key's turns on this chain, a checkpoint of another
    chain was refused as signed by "a retired key": its chain is what is wrong with it."""
    ranged = KeyRing()
    ranged.add(signer.public_key, [KeyRange("acme", 1, None)])
    other = make_checkpoint("globex", 4, checkpoint_of(chain, signer, 4)["root_hash"], signer)
    for kw in ({"saved": [other]}, {"checkpoint": other, "chain": "acme"}):
        report = verify(chain, ranged, **kw)
        assert "for chain 'globex', not 'acme'" in report.reason, report


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"note": "covers everything"}, "is an object with fields"),  # anyone can add one
        ({"v": 2}, "checkpoint.v must be 1"),
        ({"v": True}, "checkpoint.v must be 1"),
        ({"chain": ""}, "checkpoint.chain must be a non-empty string"),
        ({"tree_size": -1}, "tree_size must be a non-negative integer"),
        ({"tree_size": 3.0}, "tree_size must be a non-negative integer"),
    ],
)
def test_a_checkpoint_of_another_shape_is_refused_even_when_signed(
    change: dict[str, Any], says: str
) -> None:
    """A checkpoint is the v1 shape exactly, whoever signed it: a key holder's signature over
    another shape (or a field added beside the signed ones) is not a checkpoint."""
    signer = Signer.generate()
    ring = KeyRing()
    ring.add(signer.public_key)
    genuine = make_checkpoint("acme", 3, "ab" * 32, signer)
    assert checkpoint_problem(genuine, ring) is None
    unsigned = {k: v for k, v in {**genuine, **change}.items() if k != "signature"}
    signature = base64.b64encode(signer.sign(rfc8785.dumps(unsigned))).decode()
    problem = checkpoint_problem({**unsigned, "signature": signature}, ring)
    assert problem is not None and says in problem, problem
