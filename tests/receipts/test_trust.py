"""What a verifier trusts: a key signs only inside its recorded ranges, for receipts and for
checkpoints alike; a bundle carries its signed checkpoint and nothing past it; a key rotated
in before its first receipt is listed, so the checkpoint it signs verifies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ledger_kit import attacker, fill, ledger, migrated
from receipt_samples import SCHEMAS, draft
from test_bundle import read, rewrite

from receipts.bundle_verify import verify_bundle
from receipts.bundle_writer import write_bundle
from receipts.canonical import canonical_json
from receipts.checkpoint import checkpoint_problem, make_checkpoint
from receipts.merkle import MerkleTree
from receipts.record import GENESIS_PREV_HASH, Receipt
from receipts.seal import seal
from receipts.signing import KeyRange, KeyRing, Signer

OLD, NEW = Signer.generate(), Signer.generate()


def turns(chain: str, size: int, retire_at: int) -> list[Receipt]:
    """Seqs 1..size of ``chain``: OLD signs up to ``retire_at``, NEW after it."""
    receipts, prev = [], GENESIS_PREV_HASH
    for seq in range(1, size + 1):
        signer = OLD if seq <= retire_at else NEW
        receipts.append(seal(draft(chain, city=f"C{seq}"), seq=seq, prev_hash=prev, signer=signer))
        prev = receipts[-1].entry_hash
    return receipts


def pinned(chain: str = "acme", retire_at: int = 5) -> str:
    """GET /audit/keys as saved after the rotation: OLD 1..retire_at, NEW from then on."""
    return json.dumps(
        [
            {
                "key_id": s.key_id,
                "public_key_pem": s.public_key_pem(),
                "ranges": [{"chain": chain, "first_seq": first, "last_seq": last}],
            }
            for s, first, last in ((OLD, 1, retire_at), (NEW, retire_at + 1, None))
        ]
    )


def bundle(
    path: Path, receipts: list[Receipt], checkpoint: Any, keys_json: str | None = None
) -> Path:
    write_bundle(
        path,
        [r.to_json_obj() for r in receipts],
        SCHEMAS,
        json.loads(keys_json or pinned(receipts[0].chain)),
        checkpoint,
        prev_entry_hash="0" * 64,
        proofs={"left": [], "right": []},
    )
    return path


def signed_checkpoint(receipts: list[Receipt], signer: Signer, size: int | None = None) -> Any:
    size = len(receipts) if size is None else size
    root = MerkleTree.from_entry_hashes(r.entry_hash for r in receipts[:size]).root().hex()
    return make_checkpoint(receipts[0].chain, size, root, signer)


def test_a_key_ranged_on_other_chains_signs_nothing_of_this_one(tmp_path: Path) -> None:
    """The thief of the retired key starts a chain whose name only looks like the tenant's
    (a Cyrillic "а"): the saved ranges name "acme" alone, so nothing of it is trusted."""
    lookalike = "\u0430cme"
    forged = turns(lookalike, 8, retire_at=8)
    path = bundle(tmp_path / "forged.tar.gz", forged, signed_checkpoint(forged, OLD))
    report = verify_bundle(path, pinned())
    assert not report.ok and report.first_failure_seq == 1
    assert "'\\u0430cme'" in report.reason  # the name as the auditor can tell it apart
    assert verify_bundle(path, OLD.public_key_pem()).ok  # a bare key pins no chain
    expected = verify_bundle(path, OLD.public_key_pem(), chain="acme")
    assert not expected.ok and expected.reason == "the bundle is of chain '\\u0430cme', not 'acme'"


def test_a_retired_key_cannot_sign_a_checkpoint_past_its_range(tmp_path: Path) -> None:
    """Cutting the chain at 17 and signing that size with the key retired at 5 would hide
    the tail 18..30 from anyone who saved no later checkpoint."""
    receipts = turns("acme", 30, retire_at=5)
    cut = receipts[:17]
    path = bundle(tmp_path / "cut.tar.gz", cut, signed_checkpoint(cut, OLD))
    report = verify_bundle(path, pinned())
    assert not report.ok
    assert "tree size 17 signed by key" in report.reason and OLD.key_id in report.reason
    assert verify_bundle(
        bundle(tmp_path / "ok.tar.gz", cut, signed_checkpoint(cut, NEW)), pinned()
    ).ok


@pytest.mark.parametrize(
    ("key", "size", "allowed"),
    [
        (OLD, 5, True),  # the retired key's last leaf
        (OLD, 3, True),
        (OLD, 6, False),
        (NEW, 5, True),  # rotated in: signs the head it took over before its first receipt
        (NEW, 2, True),  # a later turn: no tail of the chain to hide
        (NEW, 900, True),
    ],
)
def test_a_checkpoint_key_must_still_have_had_its_turn(
    key: Signer, size: int, allowed: bool
) -> None:
    ring = KeyRing()
    ring.add(OLD.public_key, [KeyRange("acme", 1, 5)])
    ring.add(NEW.public_key, [KeyRange("acme", 6, None)])
    receipts = turns("acme", max(size, 1), retire_at=5)
    problem = checkpoint_problem(signed_checkpoint(receipts, key, size), ring)
    assert (problem is None) is allowed, problem


def test_a_bundle_must_carry_a_checkpoint_covering_its_last_receipt(tmp_path: Path) -> None:
    receipts = turns("acme", 10, retire_at=10)
    keys = json.dumps(
        [{"key_id": OLD.key_id, "public_key_pem": OLD.public_key_pem(), "ranges": []}]
    )
    whole = bundle(tmp_path / "whole.tar.gz", receipts, signed_checkpoint(receipts, OLD), keys)
    null = verify_bundle(
        rewrite(whole, {**read(whole), "checkpoint.json": b"null"}), allow_range=True
    )
    assert not null.ok and "checkpoint.json must hold the signed checkpoint" in null.reason
    short_checkpoint = canonical_json(signed_checkpoint(receipts, OLD, 3))
    short = rewrite(whole, {**read(whole), "checkpoint.json": short_checkpoint})
    report = verify_bundle(short, allow_range=True)
    assert (
        not report.ok and "seq 4..10 lie past the signed checkpoint's tree size 3" in report.reason
    )


def test_a_key_rotated_in_before_its_first_receipt_signs_a_checkpoint_that_verifies(
    db_url: str, tmp_path: Path
) -> None:
    """A gateway killed (no closing checkpoint), restarted on a new key and asked for a
    checkpoint (an export) before it signed any receipt: the new key is listed from the next
    seq on, and everything verifies."""
    url = migrated(db_url)
    with ledger(url, OLD) as led:
        fill(led, 5)
    with attacker(url) as conn:  # the closing checkpoint the kill -9 never wrote
        conn.exec_driver_sql("DELETE FROM checkpoints")
    with ledger(url, NEW) as led:
        checkpoint = led.checkpoint_now("acme")
        assert (checkpoint["tree_size"], checkpoint["key_id"]) == (5, NEW.key_id)
        keys = {k["key_id"]: k["ranges"] for k in led.public_keys("acme")}
        assert keys == {  # the chain is handed to the new key at its head
            OLD.key_id: [{"chain": "acme", "first_seq": 1, "last_seq": 5}],
            NEW.key_id: [{"chain": "acme", "first_seq": 6, "last_seq": None}],  # no receipt yet
        }
        assert led.verify("acme").ok
        path = tmp_path / "rotated.tar.gz"
        led.export("acme", path)
        assert verify_bundle(path).ok
        assert verify_bundle(path, json.dumps(led.public_keys("acme"))).ok


def test_a_replica_whose_key_lost_the_head_leaves_its_checkpoints_to_the_new_key(
    db_url: str,
) -> None:
    """A rolling restart: the old replica closes after the new one extended the chain. Its
    closing checkpoint would sign a size past its key's turn, which no verifier accepts."""
    url = migrated(db_url)
    with ledger(url, NEW) as new:
        with ledger(url, OLD) as old:
            fill(old, 3)  # a chain's first batch is checkpointed at once
            fill(old, 2)  # 4..5 wait for the timer or the close
            fill(new, 2)
        latest = new.latest_checkpoint("acme")
        assert latest["key_id"] == OLD.key_id and latest["tree_size"] <= 5  # not 7
        assert new.verify("acme").ok
    with ledger(url, NEW) as new:  # the new key's own close covered the head
        assert new.latest_checkpoint("acme")["key_id"] == NEW.key_id
        assert new.verify("acme").ok


def test_a_rotation_hands_idle_chains_to_the_new_key(db_url: str, tmp_path: Path) -> None:
    """The new key signed acme only: beta's listing still had OLD open from seq 1 and no NEW,
    so a copy of OLD (leaked, or a stale replica) extended beta past the key list saved after
    the rotation (docs/deploy.md), and a verifier pinned to that list said OK."""
    url = migrated(db_url)
    with ledger(url, OLD) as led:
        fill(led, 3, "acme")
        fill(led, 2, "beta")
    with ledger(url, NEW) as led:
        fill(led, 1, "acme")
        saved = json.dumps(led.public_keys("beta"))
    assert {k["key_id"]: k["ranges"] for k in json.loads(saved)} == {
        OLD.key_id: [{"chain": "beta", "first_seq": 1, "last_seq": 2}],
        NEW.key_id: [{"chain": "beta", "first_seq": 3, "last_seq": None}],
    }
    with ledger(url, OLD) as led:  # the retired key at work again
        fill(led, 1, "beta")
        led.export("beta", tmp_path / "beta.tar.gz")
    report = verify_bundle(tmp_path / "beta.tar.gz", saved)
    assert not report.ok and report.first_failure_seq == 3, report


def test_keys_taking_turns_back_and_forth_keep_every_checkpoint_verifiable(
    db_url: str, tmp_path: Path
) -> None:
    """OLD, NEW, OLD again, then NEW asked for a checkpoint before it signs again: its turn
    had ended at 3, and the listing hands it the chain from 6 on, after the head it signed."""
    url = migrated(db_url)
    for signer, count in ((OLD, 2), (NEW, 1), (OLD, 2)):
        with ledger(url, signer) as led:
            fill(led, count)
    with attacker(url) as conn:  # the last close was a kill -9: nothing signed at 5
        conn.exec_driver_sql("DELETE FROM checkpoints WHERE tree_size = 5")
    with ledger(url, NEW) as led:
        assert led.checkpoint_now("acme")["key_id"] == NEW.key_id
        new_turns = next(k for k in led.public_keys("acme") if k["key_id"] == NEW.key_id)
        assert new_turns["ranges"] == [
            {"chain": "acme", "first_seq": 3, "last_seq": 3},
            {"chain": "acme", "first_seq": 6, "last_seq": None},  # its empty turn, now its own
        ]
        assert led.verify("acme").ok
        led.export("acme", tmp_path / "b.tar.gz")
        assert verify_bundle(tmp_path / "b.tar.gz", json.dumps(led.public_keys("acme"))).ok


def test_a_passing_report_says_the_saved_checkpoints_were_passed_through(tmp_path: Path) -> None:
    receipts = turns("acme", 12, retire_at=12)
    keys = json.dumps(
        [{"key_id": OLD.key_id, "public_key_pem": OLD.public_key_pem(), "ranges": []}]
    )
    path = bundle(tmp_path / "b.tar.gz", receipts, signed_checkpoint(receipts, OLD), keys)
    saved = [signed_checkpoint(receipts, OLD, 4), signed_checkpoint(receipts, OLD, 9)]
    report = verify_bundle(path, OLD.public_key_pem(), saved=saved)
    assert report.ok
    assert report.notes[1] == (
        "the receipts pass through the root of each saved checkpoint (tree size 4, 9)"
    )
    assert len(verify_bundle(path, OLD.public_key_pem()).notes) == 1
