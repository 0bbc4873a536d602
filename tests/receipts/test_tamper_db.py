"""Tampering with the database, as an attacker holding its credentials would (append-only
triggers bypassed): the database verifier and the offline verifier of an export both detect
every edit and name the first seq it breaks."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from ledger_kit import at_seq, attacker, body_of, clone, draft, fill, ledger, migrated

from receipts.bundle_verify import verify_bundle
from receipts.canonical import canonical_json
from receipts.checkpoint import make_checkpoint
from receipts.errors import ChainDamaged, LedgerUnavailable, OutOfRange
from receipts.ledger import Ledger, ReceiptQuery
from receipts.manifest import schema_hash
from receipts.merkle import CompactRange, leaf_hash
from receipts.record import Receipt, entry_hash_of
from receipts.signing import KeyRing, Signer
from receipts.store import receipt_text

N = 30
T = "acme"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pristine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Signer, dict[str, Any]]:
    """A chain of N receipts with a signed checkpoint at N (the one an auditor saves),
    built once per database kind; each test tampers with its own copy."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('pristine') / 'ledger.db'}"
    else:
        server = request.getfixturevalue("postgres_server_url")
        url = clone(server, "pristine_" + uuid.uuid4().hex[:8], template="template1")
    migrated(url)
    signer = Signer.generate()
    with ledger(url, signer, checkpoint_every=10_000) as led:
        fill(led, N // 2)
        led.checkpoint_now(T)
        fill(led, N - N // 2)
        saved = led.checkpoint_now(T)
        assert led.verify(T).ok
    return url, signer, saved


@pytest.fixture
def chain(pristine: tuple[str, Signer, dict[str, Any]]) -> tuple[str, Signer, dict[str, Any]]:
    url, signer, saved = pristine
    return clone(url, "t_" + uuid.uuid4().hex[:12]), signer, saved


def detected(
    url: str, signer: Signer, tmp_path: Path, seq: int, reason: str, **verify: Any
) -> None:
    """Both verifiers fail at ``seq`` with ``reason``: the database one, and the offline one
    on a bundle exported by a read-only ledger (an auditor's export) pinned to the key; or
    the export itself refuses, naming ``seq``, when the receipts are no longer consecutive
    (the offline verifier's report is then None)."""
    with Ledger(url, None) as led:
        report = led.verify(T, **verify)
        assert (report.ok, report.first_failure_seq) == (False, seq), report
        assert reason in report.reason
        bundle = tmp_path / "bundle.tar.gz"
        try:
            led.export(T, bundle)
        except ChainDamaged as exc:
            assert f"receipt seq {seq} is missing" in str(exc)
            return None
    offline = verify_bundle(bundle, signer.public_key_pem())
    assert (offline.ok, offline.first_failure_seq) == (False, seq), offline
    return offline


def rewrite(conn: sa.Connection, seq: int, obj: dict[str, Any]) -> None:
    """Replace receipt ``seq`` by ``obj``, keeping the row's indexed columns consistent."""
    conn.execute(
        sa.text(
            "UPDATE receipts SET body = :b, entry_hash = :e, prev_hash = :p, key_id = :k, id = :i,"
            " created_at = :t WHERE chain = :c AND seq = :s"
        ),
        {
            "b": receipt_text(Receipt.from_json_obj(obj)),
            "e": obj["entry_hash"],
            "p": obj["prev_hash"],
            "k": obj["key_id"],
            "i": obj["id"],
            "t": obj["created_at"],
            "c": T,
            "s": seq,
        },
    )


def resign(obj: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """What an attacker with their own key does after editing: rehash and sign anew."""
    obj = {**obj, "key_id": signer.key_id}
    body = {k: v for k, v in obj.items() if k not in ("entry_hash", "signature")}
    obj["entry_hash"] = entry_hash_of(body)
    obj["signature"] = base64.b64encode(signer.sign(bytes.fromhex(obj["entry_hash"]))).decode()
    return obj


def test_edited_field(chain, tmp_path: Path) -> None:
    url, signer, _ = chain
    with attacker(url) as conn:
        obj = body_of(conn, T, 7)
        obj["output"]["tool_calls"][0]["arguments"]["city"] = "Atlantis"
        rewrite(conn, 7, obj)
    detected(url, signer, tmp_path, 7, "entry_hash does not match")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("model", "other"),
        ("created_at", "2000-01-01T00:00:00.000000Z"),  # would steer exports by time
        ("tenant", "globex"),
        ("finish_reason", "length"),
        ("key_id", "ed25519:" + "0" * 32),
        ("manifest_hash", "0" * 64),
        ("schema_hash", "0" * 64),
        ("output_kind", "text"),
        ("prev_hash", "1" * 64),
        ("id", "rcpt_" + "0" * 24),
    ],
)
def test_edited_index_column_only(chain, column: str, value: str) -> None:
    """A row whose query columns lie (steering audits away from it) is named too, whichever
    column it is."""
    url, _, _ = chain
    with attacker(url) as conn:
        conn.execute(
            sa.text(f"UPDATE receipts SET {column} = :v WHERE chain = :c AND seq = 12"),
            {"v": value, "c": T},
        )
    with Ledger(url, None) as led:
        report = led.verify(T)
    assert report.first_failure_seq == 12 and f"'{column}'" in report.reason, report


def test_a_range_whose_last_receipts_were_deleted_fails_where_they_stop(chain) -> None:
    """Receipts deleted from the end with their checkpoint, the head row left: a verification
    of a range up to the head names the first missing seq, as the whole chain's does (a range
    passed on the receipts that were left)."""
    url, signer, _ = chain
    with ledger(url, signer, checkpoint_every=10_000) as led:
        fill(led, 3)  # seqs N+1..N+3, and a closing checkpoint at N+3
    with attacker(url) as conn:
        cut = {"c": T, "s": N + 1}
        conn.execute(sa.text("DELETE FROM receipts WHERE chain = :c AND seq > :s"), cut)
        conn.execute(sa.text("DELETE FROM checkpoints WHERE chain = :c AND tree_size > :s"), cut)
    with Ledger(url, None) as led:
        for first in (None, 1, 5, N + 1):
            report = led.verify(T, first, N + 3)
            assert (report.ok, report.first_failure_seq) == (False, N + 2), (first, report)
            assert "receipt missing" in report.reason
        assert not led.verify(T).ok
        with pytest.raises(OutOfRange, match=f"ends at seq {N + 3}: seq {N + 4} is beyond"):
            led.verify(T, 1, N + 4)
        with pytest.raises(OutOfRange, match="bad seq range 5..3"):
            led.verify(T, 5, 3)
        assert led.verify(T, 5, 4).checked == 0  # an empty range: from_seq one past to_seq


def test_a_range_that_starts_just_past_a_checkpoint_is_anchored_by_it(chain) -> None:
    """The latest checkpoint at N anchors a range from N + 1 (its root is the range's left
    edge), and a saved checkpoint at N is reached there too."""
    url, signer, saved = chain
    with ledger(url, signer, checkpoint_every=10_000) as led:
        fill(led, 3)
    with attacker(url) as conn:  # as if no checkpoint had been signed since N
        conn.execute(
            sa.text("DELETE FROM checkpoints WHERE chain = :c AND tree_size > :s"),
            {"c": T, "s": N},
        )
    with Ledger(url, None) as led:
        report = led.verify(T, N + 1)
        assert report.ok and report.tree_size == N, report
        assert led.verify(T, N + 1, saved=[saved]).ok


def test_an_older_checkpoint_signed_over_a_root_the_receipts_lack_is_named(chain) -> None:
    """A stored checkpoint below the latest, validly signed by the chain's key over another
    root (a signer bug, a replica that diverged): the database still serves it, so its
    verification must name it."""
    url, signer, _ = chain
    with attacker(url) as conn:
        where = {"c": T, "s": N // 2}
        old = json.loads(
            conn.execute(
                sa.text("SELECT body FROM checkpoints WHERE chain = :c AND tree_size = :s"), where
            ).scalar_one()
        )
        forged = make_checkpoint(T, N // 2, "ab" * 32, signer, old["timestamp"])
        conn.execute(
            sa.text("UPDATE checkpoints SET body = :b WHERE chain = :c AND tree_size = :s"),
            {"b": canonical_json(forged).decode(), **where},
        )
    with Ledger(url, None) as led:
        report = led.verify(T)
    assert (report.ok, report.first_failure_seq) == (False, N // 2), report
    assert "does not match the stored checkpoint" in report.reason


FORGED_CALL = "call_" + "f" * 24
FORGE_CALL = "INSERT INTO receipt_calls (chain, call_id, seq, tool_name) VALUES ('{T}', '{c}', {s}, 'transfer_funds')"
FORGE_LINK = "INSERT INTO receipt_links (chain, seq, position, tool_call_id, receipt_id) VALUES ('{T}', {s}, 0, '{c}', NULL)"


def test_a_forged_call_row_on_a_real_receipt_links_only_its_real_calls(chain: Any) -> None:
    """Linking a request's tool results reads each issuing receipt once for all its rows:
    the real call of seq 3 links, the call a forged row gives seq 3 does not."""
    url, _, _ = chain
    with attacker(url) as conn:
        conn.execute(sa.text(FORGE_CALL.format(T=T, c=FORGED_CALL, s=3)))
    with Ledger(url, None) as led:
        receipts = led.query(ReceiptQuery(tenant=T, limit=N)).items
        issued = {c["id"]: r.id for r in receipts for c in r.tool_calls}
        assert len(issued) == N and FORGED_CALL not in issued
        assert led.issuers(T, [FORGED_CALL, *issued, FORGED_CALL]) == issued


@pytest.mark.parametrize(
    ("statement", "seq", "says"),
    [
        (  # a receipt made to look as if it had issued a call (triggers need not be off)
            FORGE_CALL.format(T=T, c=FORGED_CALL, s=3),
            3,
            "its receipt_calls rows",
        ),
        ("UPDATE receipt_calls SET tool_name = 'other' WHERE seq = 9", 9, "receipt_calls"),
        ("DELETE FROM receipt_calls WHERE seq = 9", 9, "receipt_calls"),
        (  # a receipt made to look as if it had answered a call
            FORGE_LINK.format(T=T, c=FORGED_CALL, s=5),
            5,
            "its receipt_links rows",
        ),
        (
            FORGE_CALL.format(T=T, c=FORGED_CALL, s=N + 4),
            N + 4,
            "which the chain does not hold",
        ),
    ],
)
def test_index_rows_that_disagree_with_the_bodies(
    chain, statement: str, seq: int, says: str
) -> None:
    """The rows /audit/calls and the tool_name filter read are copies of the signed bodies:
    a forged, edited or deleted one fails verification at its seq, and no query answers
    from it meanwhile."""
    url, _, _ = chain
    with attacker(url) as conn:
        conn.execute(sa.text(statement))
    with Ledger(url, None) as led:
        report = led.verify(T)
        assert (report.ok, report.first_failure_seq) == (False, seq), report
        assert says in report.reason
        assert led.find_call(T, FORGED_CALL) is None
        assert led.issuers(T, [FORGED_CALL]) == {}
        assert led.answers_to(T, FORGED_CALL).items == []
        page = led.query(ReceiptQuery(tenant=T, tool_name="transfer_funds"))
        assert page.items == []


def test_a_signing_key_row_replaced_by_another_key(chain) -> None:
    """The stored PEM no longer matches its key id: a failed report saying so, not a crash
    (the API answered 500 internal_error)."""
    url, _, _ = chain
    with attacker(url) as conn:
        conn.execute(
            sa.text("UPDATE signing_keys SET public_key_pem = :p"),
            {"p": Signer.generate().public_key_pem()},
        )
    with Ledger(url, None) as led:
        report = led.verify(T)
    assert not report.ok and report.chain == T
    assert (
        report.reason.startswith("stored signing keys: key id")
        and "does not match" in report.reason
    )


def test_deleted_row(chain, tmp_path: Path) -> None:
    url, signer, _ = chain
    with attacker(url) as conn:
        conn.execute(sa.text("DELETE FROM receipts WHERE chain = :c AND seq = 9"), {"c": T})
    detected(url, signer, tmp_path, 9, "expected seq 9, found seq 10")


def test_swapped_rows(chain, tmp_path: Path) -> None:
    """Two receipts trade places, their seq and links rewritten to look in order."""
    url, signer, _ = chain
    with attacker(url) as conn:
        a, b = body_of(conn, T, 5), body_of(conn, T, 6)
        a_moved = {**a, "seq": 6, "prev_hash": b["entry_hash"]}
        b_moved = {**b, "seq": 5, "prev_hash": a["prev_hash"]}
        conn.execute(
            sa.text("UPDATE receipts SET id = 'moving' WHERE chain = :c AND seq = 6"), {"c": T}
        )  # receipt ids are unique: free one while they trade places
        rewrite(conn, 5, b_moved)
        rewrite(conn, 6, a_moved)
    detected(url, signer, tmp_path, 5, "entry_hash does not match")


def test_swapped_rows_naively(chain) -> None:
    """Rows trade bodies as they are: the verifier sees them out of order."""
    url, _, _ = chain
    with attacker(url) as conn:
        a, b = body_of(conn, T, 5), body_of(conn, T, 6)
        for seq, obj in ((5, b), (6, a)):
            conn.execute(
                sa.text("UPDATE receipts SET body = :b WHERE chain = :c AND seq = :s"),
                {"b": json.dumps(obj), "c": T, "s": seq},
            )
    with Ledger(url, None) as led:
        report = led.verify(T)
    assert report.first_failure_seq == 5 and "'id'" in report.reason


def test_forged_receipt_inserted(chain, tmp_path: Path) -> None:
    """A receipt forged with the attacker's key, appended as the new head (head row, Merkle
    frontier and all), so that even a fresh export checkpoint covers it."""
    url, signer, _ = chain
    mallory = Signer.generate()
    with attacker(url) as conn:
        last = body_of(conn, T, N)
        forged = resign(
            {**last, "seq": N + 1, "prev_hash": last["entry_hash"], "id": "rcpt_" + "e" * 24},
            mallory,
        )
        row = (
            conn.execute(
                sa.text("SELECT * FROM receipts WHERE chain = :c AND seq = :s"), {"c": T, "s": N}
            )
            .mappings()
            .one()
        )
        conn.execute(
            sa.text(
                "INSERT INTO receipts (chain, seq, id, created_at, tenant, key_id, manifest_hash,"
                " schema_hash, model, output_kind, finish_reason, prev_hash, entry_hash, body)"
                " VALUES (:chain, :seq, :id, :created_at, :tenant, :key_id, :manifest_hash,"
                " :schema_hash, :model, :output_kind, :finish_reason, :prev_hash, :entry_hash,"
                " :body)"
            ),
            {
                **row,
                "seq": N + 1,
                "id": forged["id"],
                "key_id": mallory.key_id,
                "prev_hash": forged["prev_hash"],
                "entry_hash": forged["entry_hash"],
                "body": receipt_text(Receipt.from_json_obj(forged)),
            },
        )
        head = conn.execute(
            sa.text("SELECT frontier FROM chains WHERE chain = :c"), {"c": T}
        ).scalar_one()
        tree = CompactRange(N, [bytes.fromhex(h) for h in head.split(",")])
        tree.append(leaf_hash(bytes.fromhex(forged["entry_hash"])))
        conn.execute(
            sa.text(
                "UPDATE chains SET head_seq = :s, head_hash = :h, frontier = :f WHERE chain = :c"
            ),
            {
                "s": N + 1,
                "h": forged["entry_hash"],
                "c": T,
                "f": ",".join(h.hex() for h in tree.hashes),
            },
        )
    with Ledger(url, signer) as led:  # the operator's export signs a fresh checkpoint
        assert led.verify(T).first_failure_seq == N + 1
        led.export(T, tmp_path / "forged.tar.gz")
    offline = verify_bundle(tmp_path / "forged.tar.gz", signer.public_key_pem())
    assert offline.first_failure_seq == N + 1 and "unknown key" in offline.reason
    detected(url, signer, tmp_path, N + 1, "unknown key")


def test_resigned_with_another_key(chain, tmp_path: Path) -> None:
    url, signer, _ = chain
    with attacker(url) as conn:
        obj = body_of(conn, T, 11)
        obj["output"]["tool_calls"][0]["arguments"]["days"] = 9
        rewrite(conn, 11, resign(obj, Signer.generate()))
    detected(url, signer, tmp_path, 11, "unknown key")


def test_resigned_with_a_key_registered_by_the_attacker(chain) -> None:
    """Keys listed in the database are only as good as the database: pin the real key."""
    url, signer, _ = chain
    mallory = Signer.generate()
    with attacker(url) as conn:
        obj = body_of(conn, T, 11)
        obj["output"]["tool_calls"][0]["arguments"]["days"] = 9
        rewrite(conn, 11, resign(obj, mallory))
        conn.execute(
            sa.text("INSERT INTO signing_keys VALUES (:k, :p, '2026-01-01T00:00:00Z')"),
            {"k": mallory.key_id, "p": mallory.public_key_pem()},
        )
    pinned = KeyRing()
    pinned.add(signer.public_key)
    with Ledger(url, None) as led:
        report = led.verify(T, keyring=pinned)
        assert report.first_failure_seq == 11 and "unknown key" in report.reason
        assert led.verify(T).first_failure_seq in (11, 12)  # the link to 12 breaks anyway


def test_truncated_tail(chain, tmp_path: Path) -> None:
    """The last receipts and the head row rolled back to seq 20: the stored checkpoint (and
    the auditor's saved copy, once the stored ones are gone too) shows the loss."""
    url, signer, saved = chain
    with attacker(url) as conn:
        for table in ("receipts", "receipt_calls"):  # a careful attacker: index rows too
            conn.execute(sa.text(f"DELETE FROM {table} WHERE chain = :c AND seq > 20"), {"c": T})
        tip = body_of(conn, T, 20)["entry_hash"]
        conn.execute(
            sa.text("UPDATE chains SET head_seq = 20, head_hash = :h WHERE chain = :c"),
            {"h": tip, "c": T},
        )
    assert detected(url, signer, tmp_path, 21, "truncated") is None  # the export refuses
    with Ledger(url, signer) as led:  # the operator's own ledger refuses to go on
        with pytest.raises(LedgerUnavailable, match="behind its own checkpoint"):
            led.checkpoint_now(T)
        with pytest.raises(LedgerUnavailable, match="behind its own checkpoint"):
            led.append(draft())
    with attacker(url) as conn:
        conn.execute(sa.text("DELETE FROM checkpoints WHERE chain = :c"), {"c": T})
    with Ledger(url, None) as led:
        assert led.verify(T).ok  # nothing left in the database to compare with...
        report = led.verify(T, saved=[saved])  # ...but the auditor kept a checkpoint
    assert report.first_failure_seq == 21 and "truncated" in report.reason


def test_edited_old_checkpoint(chain) -> None:
    """A stored checkpoint below the latest, rewritten: named at the seq it covers up to."""
    url, _, _ = chain
    with attacker(url) as conn:
        conn.execute(
            sa.text("UPDATE checkpoints SET body = replace(body, root_hash, :r) WHERE chain = :c"
                    " AND tree_size = :s"),
            {"r": "0" * 64, "c": T, "s": N // 2},
        )  # fmt: skip
    with Ledger(url, None) as led:
        report = led.verify(T)
    assert report.first_failure_seq == N // 2
    assert f"stored checkpoint at tree size {N // 2}: checkpoint signature" in report.reason


def test_edited_schema(chain, tmp_path: Path) -> None:
    url, signer, _ = chain
    with attacker(url) as conn:
        bound = body_of(conn, T, 1)["manifest"]["schema_hash"]
        schema = json.loads(
            conn.execute(
                sa.text("SELECT body FROM schemas WHERE hash = :h"), {"h": bound}
            ).scalar_one()
        )
        schema["anyOf"][0]["properties"]["arguments"]["additionalProperties"] = True
        assert schema_hash(schema) != bound
        conn.execute(  # canonical, as the ledger stores schemas: only the hash tells
            sa.text("UPDATE schemas SET body = :b WHERE hash = :h"),
            {"b": canonical_json(schema).decode(), "h": bound},
        )
    detected(url, signer, tmp_path, 1, "edited")


def test_proofs_and_exports_that_need_a_deleted_row_say_the_chain_is_damaged(chain) -> None:
    """Typed, so the gateway answers "the ledger is damaged" and not a bare 500."""
    url, signer, _ = chain
    with attacker(url) as conn:
        conn.execute(sa.text("DELETE FROM receipts WHERE chain = :c AND seq = 3"), {"c": T})
        conn.execute(sa.text("DELETE FROM merkle_nodes WHERE chain = :c"), {"c": T})
    with Ledger(url, signer) as led:
        with pytest.raises(ChainDamaged, match="lacks the subtree"):
            led.inclusion_proof(T, 5)
        with pytest.raises(ChainDamaged, match="seq 3 .* is missing"):
            led.export(T, Path("/dev/null"), since=at_seq(led, T, 4).created_at)


def test_verifying_a_range_over_deleted_merkle_nodes_is_a_failed_report(chain) -> None:
    url, signer, _ = chain
    with attacker(url) as conn:
        conn.execute(sa.text("DELETE FROM merkle_nodes WHERE chain = :c"), {"c": T})
    with Ledger(url, signer) as led:
        report = led.verify(T, from_seq=5)
    assert not report.ok and "lacks the subtree" in report.reason, report


@pytest.mark.parametrize("statement", ["UPDATE", "DELETE"])
def test_a_stored_merkle_node_that_lies(chain, statement: str) -> None:
    """Proofs are read from merkle_nodes: a wrong or missing node fails verification at the
    receipt that completes its subtree (seq 8: level 2, index 1), not only the proofs."""
    url, _, _ = chain
    with attacker(url) as conn:
        where = f"WHERE chain = '{T}' AND level = 2 AND idx = 1"
        if statement == "UPDATE":
            conn.execute(sa.text(f"UPDATE merkle_nodes SET hash = :h {where}"), {"h": bytes(32)})
        else:
            conn.execute(sa.text(f"DELETE FROM merkle_nodes {where}"))
    with Ledger(url, None) as led:
        report = led.verify(T)
        ranged = led.verify(T, 5, 12)
    for r in (report, ranged):
        assert (r.ok, r.first_failure_seq) == (False, 8), r
        assert "stored Merkle node at level 2, index 1 is" in r.reason


def test_a_row_moved_into_another_tenants_chain_is_not_shown_to_it(db_url: str) -> None:
    """An attacker moves tenant pb's signed receipts (and their index rows) into pa's chain
    and relabels a row's id: pa's auditor must never see pb's receipts, in a listing, by id,
    by seq, as a call's issuer or as its answer. The row columns say pa; the signed bodies say
    pb, and reads answer from the bodies (verify names the rows)."""
    migrated(db_url)
    with ledger(db_url) as led:
        own = fill(led, 3, "pa")
        issued = led.append(draft("pb"))
        call = issued.tool_calls[0]["id"]
        answer = led.append(draft("pb", links=[{"tool_call_id": call, "receipt_id": issued.id}]))
    relabelled = "rcpt_" + "d" * 24
    with attacker(db_url) as conn:
        for table in ("receipts", "receipt_calls", "receipt_links"):
            for seq, moved_to in ((issued.seq, 100), (answer.seq, 101)):
                conn.execute(
                    sa.text(
                        f"UPDATE {table} SET chain = 'pa', seq = :to"
                        " WHERE chain = 'pb' AND seq = :s"
                    ),
                    {"to": moved_to, "s": seq},
                )
        conn.execute(
            sa.text("UPDATE receipts SET id = :i WHERE chain = 'pa' AND seq = 2"), {"i": relabelled}
        )
    with Ledger(db_url, None) as led:
        assert [r.id for r in led.query(ReceiptQuery("pa")).items] == [r.id for r in own]
        by_tool = led.query(ReceiptQuery("pa", tool_name="get_weather")).items
        assert [r.id for r in by_tool] == [r.id for r in own]
        assert led.query(ReceiptQuery("pa", call_id=call)).items == []
        assert led.get("pa", issued.id) is None and led.get("pa", answer.id) is None
        assert led.find_call("pa", call) is None
        assert led.issuers("pa", [call]) == {}
        assert led.answers_to("pa", call).items == []
        assert led.get("pa", relabelled) is None  # the row's id says one thing, its body another
        assert led.get("pa", own[1].id) is None  # and no row holds that id any more
        report = led.verify("pa")
        assert (report.ok, report.first_failure_seq) == (False, 2), report


def test_head_row_rolled_back(chain) -> None:
    """A genuine receipt appended, then the chain's head row put back as it was before it:
    the receipt lies past the head the ledger would extend next."""
    url, signer, _ = chain
    with attacker(url) as conn:
        before = conn.execute(sa.text("SELECT * FROM chains WHERE chain = :c"), {"c": T})
        head = before.mappings().one()
    with ledger(url, signer, checkpoint_every=10_000) as led:
        fill(led, 1)
    with attacker(url) as conn:
        conn.execute(
            sa.text(
                "UPDATE chains SET head_seq = :head_seq, head_hash = :head_hash,"
                " frontier = :frontier WHERE chain = :chain"
            ),
            dict(head),
        )
    with Ledger(url, None) as led:
        for span in ((None, None), (1, N + 1), (N + 1, N + 1)):  # a range reaching past it too
            report = led.verify(T, *span)
            assert (report.ok, report.first_failure_seq) == (False, N + 1), (span, report)
            assert f"receipt stored beyond the chain head ({N})" in report.reason
        assert led.verify(T, 1, N).ok  # up to the head, the chain is what it was


def test_tail_and_its_checkpoints_cut_below_the_head(chain) -> None:
    """The last receipts deleted with every checkpoint that signs them, the head row left as
    it was: the head row still names them."""
    url, signer, _ = chain
    with ledger(url, signer, checkpoint_every=10_000) as led:
        fill(led, 3)
    with attacker(url) as conn:
        cut = {"c": T, "s": N + 1}
        conn.execute(sa.text("DELETE FROM receipts WHERE chain = :c AND seq > :s"), cut)
        conn.execute(sa.text("DELETE FROM checkpoints WHERE chain = :c AND tree_size > :s"), cut)
    with Ledger(url, None) as led:
        report = led.verify(T)
    assert (report.ok, report.first_failure_seq) == (False, N + 2), report
    assert f"the stored receipts end before the chain head ({N + 3})" in report.reason
