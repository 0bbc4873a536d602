"""The Ledger on real databases (SQLite and Postgres): appends, group commit, queries,
pagination, checkpoints, proofs, keys and rotation, failure and recovery."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import sqlite3
import subprocess
import threading
import time
import uuid
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from faults import hold_sealing
from ledger_kit import (
    COUNT_BACKENDS,
    SEARCH_PARAMS,
    TERMINATE_BACKENDS,
    UNION,
    WEATHER_PARAMS,
    at_seq,
    attacker,
    call_id,
    clone,
    draft,
    fill,
    ledger,
    migrated,
    on_server,
    tool_union,
)

from receipts import ledger_writer, queries, store
from receipts.canonical import hash_json
from receipts.checkpoint import make_checkpoint
from receipts.errors import (
    ChainBehind,
    LedgerUnavailable,
    OutOfRange,
    ReadOnlyLedger,
    ReceiptFormatError,
    ReceiptsError,
    Stopped,
)
from receipts.ledger import Ledger, ReceiptQuery
from receipts.merkle import leaf_hash, verify_consistency, verify_inclusion
from receipts.record import GENESIS_PREV_HASH, check_request
from receipts.signing import KeyRing, Signer


def test_appends_chain_per_tenant_and_group_commit(db_url: str) -> None:
    migrated(db_url)
    with ledger(db_url) as led:
        first = led.append(draft("acme"))
        assert (first.seq, first.prev_hash, first.chain) == (1, GENESIS_PREV_HASH, "acme")
        batch = fill(led, 120, "acme")
        other = led.append(draft("globex"))
        assert [r.seq for r in batch] == list(range(2, 122))
        assert all(b.prev_hash == a.entry_hash for a, b in zip([first, *batch], batch))
        assert other.seq == 1  # chains are per tenant
        assert led.get("acme", batch[5].id) == batch[5]
        assert led.get("globex", batch[5].id) is None  # tenants are kept apart
        assert at_seq(led, "acme", 7) == batch[5]
        assert led.verify("acme").ok and led.verify("globex").ok
        assert led.chains() == ["acme", "globex"]


def test_group_commit_shares_transactions(fresh_postgres_url: str) -> None:
    migrated(fresh_postgres_url)
    with ledger(fresh_postgres_url) as led:
        commits = []
        sa.event.listen(led._writer._engine, "commit", lambda conn: commits.append(1))
        fill(led, 300)
        assert len(commits) < 30, "300 concurrent appends should share a few transactions"


def test_query_filters_and_cursor_pagination(db_url: str) -> None:
    migrated(db_url)
    weather_only = tool_union(get_weather=WEATHER_PARAMS)
    with ledger(db_url) as led:
        before = datetime.now(UTC)
        searches = [
            led.append(draft(tool="search", arguments={"query": f"q{i}"})) for i in range(5)
        ]
        small = [led.append(draft(model="tiny", schema=weather_only)) for _ in range(3)]
        fill(led, 12)
        issued = searches[2].tool_calls[0]["id"]
        answer = led.append(
            draft(
                links=[
                    {"tool_call_id": issued, "receipt_id": searches[2].id},
                    {"tool_call_id": "call_" + "f" * 24, "receipt_id": None},
                ]
            )
        )

        def all_pages(**filters: object) -> list[int]:
            seqs, cursor = [], None
            while True:
                page = led.query(ReceiptQuery("acme", after_seq=cursor, limit=4, **filters))
                seqs += [r.seq for r in page.items]
                if page.next_cursor is None:
                    return seqs
                assert page.next_cursor == page.items[-1].seq
                cursor = page.next_cursor

        assert all_pages() == list(range(1, 22))
        assert all_pages(tool_name="search") == [r.seq for r in searches]
        assert all_pages(model="tiny") == [r.seq for r in small]
        assert all_pages(schema_hash=small[0].manifest["schema_hash"]) == [r.seq for r in small]
        assert all_pages(call_id=issued) == [searches[2].seq]
        assert all_pages(since=before) == list(range(1, 22))
        assert all_pages(since=datetime.now(UTC) + timedelta(seconds=5)) == []
        middle = small[1].created_at
        assert all_pages(until=middle) == list(range(1, small[1].seq))
        assert all_pages(since=middle, model="tiny") == [small[1].seq, small[2].seq]
        assert led.query(ReceiptQuery("nobody")).items == []
        assert led.find_call("acme", issued) == searches[2]
        assert led.find_call("globex", issued) is None
        assert led.answers_to("acme", issued).items == [answer]
        assert led.answers_to("acme", "call_" + "f" * 24).items == [answer]
        assert led.schema(small[0].manifest["schema_hash"]) == weather_only
        assert led.schema("0" * 64) is None
        with pytest.raises(ReceiptFormatError, match="limit"):
            led.query(ReceiptQuery("acme", limit=0))
        with pytest.raises(ReceiptFormatError, match="RFC 3339"):
            led.query(ReceiptQuery("acme", since="yesterday"))


def test_a_requests_tool_results_find_their_issuers_in_one_query_per_chunk(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway linked each tool result with a transaction of its own, and an agent
    resends every result of its loop: now one query per CALLS_PER_QUERY distinct ids, each
    answer still checked against the signed body (test_tamper_db: a forged row)."""
    migrated(db_url)
    with ledger(db_url) as led:
        parallel = draft()
        second = {"id": call_id(), "name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}
        parallel.output["tool_calls"].append(second)
        issued = [led.append(draft()) for _ in range(3)] + [led.append(parallel)]
        elsewhere = led.append(draft("globex")).tool_calls[0]["id"]
        ids = [r.tool_calls[0]["id"] for r in issued] + [second["id"]]
        selects: list[str] = []
        sa.event.listen(
            led._reader, "before_cursor_execute", lambda _c, _u, sql, *_: selects.append(sql)
        )
        monkeypatch.setattr(queries, "CALLS_PER_QUERY", 2)
        unknown = "call_" + "0" * 24
        asked = [ids[3], unknown, ids[0], elsewhere, ids[3], ids[4], ids[1], ids[2]]
        assert led.issuers("acme", asked) == {
            ids[0]: issued[0].id,
            ids[1]: issued[1].id,
            ids[2]: issued[2].id,
            ids[3]: issued[3].id,
            ids[4]: issued[3].id,  # both calls of the parallel receipt
        }
        assert len([q for q in selects if "receipt_calls" in q]) == 4  # 7 distinct ids, 2 each
        assert led.issuers("acme", []) == {}
        assert led.find_call("acme", ids[4]) == issued[3]


def test_a_page_of_large_receipts_ends_at_its_byte_budget(db_url: str) -> None:
    """An agent can make each receipt big (retained payloads, here 1.5 MB): `limit` bounds
    rows, so a page also ends after the receipt that takes it past PAGE_BYTES, and its
    cursor goes on from there: every receipt is listed once, in order."""
    migrated(db_url)
    big = {"messages": [{"role": "user", "content": "x" * 1_500_000}], "params": {}}
    with ledger(db_url, retain_payloads=True) as led:
        for payload in [None] * 2 + [big] * 5 + [None] * 2:
            led.append(draft(payload=payload))
        pages, cursor = [], None
        while True:
            page = led.query(ReceiptQuery("acme", after_seq=cursor, limit=1000))
            pages.append([r.seq for r in page.items])
            stored = sum(len(store.receipt_text(r).encode()) for r in page.items)
            assert stored < queries.PAGE_BYTES + 1_600_000  # the budget, passed by one at most
            if page.next_cursor is None:
                break
            assert page.next_cursor == page.items[-1].seq
            cursor = page.next_cursor
        assert pages == [[1, 2, 3, 4, 5], [6, 7, 8, 9]]  # 3 x 1.5 MB pass 4 MiB


def test_a_receipt_past_the_budget_alone_still_makes_a_page(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrated(db_url)
    monkeypatch.setattr(queries, "PAGE_BYTES", 1)  # every receipt passes it
    with ledger(db_url) as led:
        fill(led, 3)
        first = led.query(ReceiptQuery("acme", limit=10))
        assert ([r.seq for r in first.items], first.next_cursor) == ([1], 1)
        last = led.query(ReceiptQuery("acme", after_seq=2, limit=10))
        assert ([r.seq for r in last.items], last.next_cursor) == ([3], None)


def test_the_answers_to_a_call_are_bounded_and_listed_on(db_url: str) -> None:
    """An agent can answer a call as often as it likes: /audit/calls takes the first ANSWERS
    and the rest are the listing `answering=call_id` from its cursor."""
    migrated(db_url)
    with ledger(db_url) as led:
        issued = led.append(draft())
        call = issued.tool_calls[0]["id"]
        link = [{"tool_call_id": call, "receipt_id": issued.id}]
        led.append(draft())  # answers nothing
        answers = fill_drafts(led, [draft(links=link) for _ in range(queries.ANSWERS + 5)])
        first = led.answers_to("acme", call)
        assert first.items == answers[: queries.ANSWERS]
        assert first.next_cursor == answers[queries.ANSWERS - 1].seq
        rest = led.query(ReceiptQuery("acme", answering=call, after_seq=first.next_cursor))
        assert (rest.items, rest.next_cursor) == (answers[queries.ANSWERS :], None)
        assert led.query(ReceiptQuery("acme", answering=call_id())).items == []


@pytest.mark.parametrize("after_seq", [None, 2])
@pytest.mark.parametrize("field", ["call_id", "answering", "tool_name"])
def test_the_call_and_link_filters_read_the_index_tables_not_the_chain(
    fresh_sqlite_url: str, field: str, after_seq: int | None
) -> None:
    """A correlated EXISTS per receipt (or a seq range on the receipts) made SQLite walk the
    whole chain: 98 ms at 120k receipts for a call id that matches nothing, and
    GET /audit/calls/{id} 350 ms. Both statements of a listing must look each receipt up by
    the seqs the index table names (and its rows up by its own index)."""
    url = migrated(fresh_sqlite_url)
    with ledger(url) as led:
        issued = led.append(draft())
        call = issued.tool_calls[0]["id"]
        fill_drafts(led, [draft() for _ in range(3)])
        answer = led.append(draft(links=[{"tool_call_id": call, "receipt_id": issued.id}]))
    value = {"call_id": call, "answering": call, "tool_name": "get_weather"}[field]
    statements: list[tuple[str, Any]] = []
    engine = sa.create_engine(url)
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append((a[2], a[3])))
    try:
        with engine.connect() as conn:
            page = queries.query(conn, ReceiptQuery("acme", after_seq=after_seq, **{field: value}))
            assert [r.seq for r in page.items] == {
                "call_id": [1] if after_seq is None else [],
                "answering": [answer.seq],
                "tool_name": [3, 4, 5] if after_seq else [1, 2, 3, 4, 5],
            }[field]
            listing = [(sql, params) for sql, params in statements if "FROM receipts" in sql]
            assert len(listing) == (2 if page.items else 1)
            for sql, params in listing:
                plan = [row[3] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params)]
                table = "receipt_links" if field == "answering" else "receipt_calls"
                assert plan[0].startswith("SEARCH receipts USING INDEX"), plan
                assert plan[0].endswith("(chain=? AND seq=?)"), plan  # by seq, not a range
                assert f"SEARCH {table} USING" in " ".join(plan), plan
                assert not any("CORRELATED" in step or "SCAN" in step for step in plan), plan
    finally:
        engine.dispose()


def fill_drafts(led: Ledger, drafts: list[Any]) -> list[Any]:
    futures = [led.submit(d) for d in drafts]
    return sorted((f.result() for f in futures), key=lambda r: r.seq)


def test_checkpoints_every_n_and_every_t(db_url: str) -> None:
    migrated(db_url)
    every, interval = 50, 1.0
    with ledger(db_url, checkpoint_every=every, checkpoint_interval_s=interval) as led:
        for _ in range(120):  # one at a time: each append is its own batch
            led.append(draft("acme"))
        checkpoints = _checkpoints(db_url, "acme")
        # the first append is checkpointed (T has passed since "never"); after that a new one
        # only once N receipts or T seconds have passed since the previous one
        assert checkpoints[0][0] == 1 and len(checkpoints) >= 3
        for (size_a, at_a), (size_b, at_b) in itertools.pairwise(checkpoints):
            assert size_b - size_a >= every or at_b - at_a >= interval - 0.05
        deadline = time.monotonic() + 10
        while led.latest_checkpoint("acme")["tree_size"] != 120:  # T elapses while idle
            assert time.monotonic() < deadline, "no checkpoint after the interval"
            time.sleep(0.1)
        cp = led.latest_checkpoint("acme")
        keys = KeyRing.from_public_keys(led.public_keys())
        from receipts.checkpoint import checkpoint_problem

        assert checkpoint_problem(cp, keys) is None
        assert led.checkpoint_now("acme") == cp  # already current: no new one


def _checkpoints(url: str, chain: str) -> list[tuple[int, float]]:
    """(tree size, signing time in epoch seconds) of every stored checkpoint, by size."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT tree_size, timestamp FROM checkpoints WHERE chain = :c"
                    " ORDER BY tree_size"
                ),
                {"c": chain},
            ).all()
    finally:
        engine.dispose()
    return [(size, datetime.fromisoformat(ts).timestamp()) for size, ts in rows]


def test_inclusion_and_consistency_proofs_from_the_store(db_url: str) -> None:
    migrated(db_url)
    with ledger(db_url, checkpoint_every=1000) as led:
        receipts = fill(led, 77)
        led.checkpoint_now("acme")
        for seq in (1, 2, 33, 64, 77):
            p = led.inclusion_proof("acme", seq)
            assert p["tree_size"] == 77 and p["checkpoint"]["root_hash"] == p["root_hash"]
            verify_inclusion(
                leaf_hash(bytes.fromhex(receipts[seq - 1].entry_hash)),
                seq - 1,
                77,
                [bytes.fromhex(h) for h in p["proof"]],
                bytes.fromhex(p["root_hash"]),
            )
        for size1, size2 in ((1, 77), (32, 77), (33, 64), (50, 51), (77, 77)):
            c = led.consistency_proof("acme", size1, size2)
            verify_consistency(
                size1,
                size2,
                [bytes.fromhex(h) for h in c["proof"]],
                bytes.fromhex(c["root1"]),
                bytes.fromhex(c["root2"]),
            )
        assert led.inclusion_proof("acme", 5, tree_size=10)["tree_size"] == 10
        with pytest.raises(OutOfRange, match="outside the tree"):
            led.inclusion_proof("acme", 78)
        with pytest.raises(OutOfRange, match="size1 <= size2"):
            led.consistency_proof("acme", 10, 5)
        with pytest.raises(OutOfRange, match="no receipts yet"):
            led.inclusion_proof("nobody", 1)


def test_key_rotation_keeps_old_keys_listed_and_verifiable(db_url: str) -> None:
    migrated(db_url)
    old, new = Signer.generate(), Signer.generate()
    with ledger(db_url, old) as led:
        fill(led, 10)
    with ledger(db_url, new) as led:
        rotated = fill(led, 5)
        assert {r.key_id for r in rotated} == {new.key_id}
        keys = {k["key_id"]: k["ranges"] for k in led.public_keys("acme")}
        assert keys == {
            old.key_id: [{"chain": "acme", "first_seq": 1, "last_seq": 10}],
            new.key_id: [{"chain": "acme", "first_seq": 11, "last_seq": None}],
        }
        report = led.verify("acme")
        assert report.ok
        # a passing report says on whose authority: both listed keys, not pinned
        note = report.notes[0]  # (a second says which seqs await the next checkpoint)
        assert "the database lists" in note and old.key_id in note and new.key_id in note
        # pinned to the new key only, the old receipts are signed by an unknown key
        pinned = KeyRing()
        pinned.add(new.public_key)
        report = led.verify("acme", keyring=pinned)
        assert not report.ok and report.first_failure_seq == 1
        assert "unknown key" in report.reason
        both = KeyRing()
        both.add(old.public_key)
        both.add(new.public_key)
        assert led.verify("acme", keyring=both).notes[0].startswith("trusted only the pinned")


def test_a_tenant_with_no_receipts_lists_no_keys(db_url: str) -> None:
    migrated(db_url)
    with ledger(db_url, Signer.generate()) as led:
        assert led.public_keys("nobody") == []
        fill(led, 1)
        assert led.public_keys("nobody") == []
        assert [k["ranges"] for k in led.public_keys("acme")] == [
            [{"chain": "acme", "first_seq": 1, "last_seq": None}]
        ]


def test_a_tenants_key_listing_tells_only_of_its_own_chain(db_url: str) -> None:
    """created_at was the key's registration, i.e. when another tenant's chain first used it;
    a tenant's listing now says when the key first signed in its own chain."""
    migrated(db_url)
    old, new = Signer.generate(), Signer.generate()
    with ledger(db_url, old) as led:
        acme = fill(led, 3, "acme")
        time.sleep(0.01)
        globex = fill(led, 2, "globex")
    with ledger(db_url, new) as led:
        time.sleep(0.01)
        rotated = led.append(draft("acme"))
        everything = {k["key_id"]: k["created_at"] for k in led.public_keys()}
        theirs = {k["key_id"]: k.get("created_at") for k in led.public_keys("globex")}
        ours = {k["key_id"]: k["created_at"] for k in led.public_keys("acme")}
    assert everything[old.key_id] <= acme[0].created_at  # the operator sees registrations
    assert theirs == {old.key_id: globex[0].created_at, new.key_id: None}  # handed over, unused
    assert ours == {old.key_id: acme[0].created_at, new.key_id: rotated.created_at}


def test_replicas_with_different_keys_interleave(fresh_sqlite_url: str) -> None:
    """Two writers with their own keys on one chain: every switch of signer starts a range,
    and each key may sign only inside its own ranges."""
    migrated(fresh_sqlite_url)
    a, b = Signer.generate(), Signer.generate()
    with ledger(fresh_sqlite_url, a) as led_a, ledger(fresh_sqlite_url, b) as led_b:
        for led in (led_a, led_b, led_a):
            fill(led, 3)
        ranges = {k["key_id"]: k["ranges"] for k in led_a.public_keys("acme")}
        assert ranges[a.key_id] == [
            {"chain": "acme", "first_seq": 1, "last_seq": 3},
            {"chain": "acme", "first_seq": 7, "last_seq": 9},  # b, registered later, is newer
        ]
        assert ranges[b.key_id] == [
            {"chain": "acme", "first_seq": 4, "last_seq": 6},
            {"chain": "acme", "first_seq": 10, "last_seq": None},
        ]
        assert led_b.verify("acme").ok


def test_writers_sharing_a_chain_keep_it_whole(db_url: str) -> None:
    """A writer seals onto the head it last committed without re-reading it. When another
    writer moved the chain meanwhile, the insert collides and the batch is redone under the
    lock, unseen by the caller; a checkpoint the other writer signed is never rolled back."""
    migrated(db_url)
    with ledger(db_url) as led_a, ledger(db_url) as led_b:
        fill(led_a, 3)  # the first batch signs a checkpoint (at 3)
        fill(led_a, 2)
        signed = led_b.checkpoint_now("acme")  # moves the checkpoint columns only
        assert fill(led_a, 1)[0].seq == 6  # a's kept head was still right
        with attacker(db_url) as conn:
            stored = conn.exec_driver_sql("SELECT checkpoint_size FROM chains").scalar_one()
        assert stored == signed["tree_size"] == 5
        assert led_a.latest_checkpoint("acme") == signed

        seqs = []
        for led in (led_b, led_a, led_b, led_a, led_a, led_b):  # every kept head goes stale
            seqs += [r.seq for r in fill(led, 4)]
        assert seqs == list(range(7, 31))
        assert led_a.verify("acme").ok
        assert led_b.checkpoint_now("acme")["tree_size"] == 30


def test_kept_head_skips_the_locking_read_until_the_chain_is_shared(db_url: str) -> None:
    """One writer per chain: after its first batch, no locking read. Once another writer has
    extended the chain (a collision, redone under the lock), the chain is locked up front."""
    migrated(db_url)
    with ledger(db_url) as led, ledger(db_url) as other:
        fill(led, 1)
        lock_head = led._writer._sql.lock_head
        locks: list[str] = []
        led._writer._sql.lock_head = lambda cursor, chain: (
            locks.append(chain) or lock_head(cursor, chain)
        )
        assert [led.append(draft()).seq for _ in range(5)] == [2, 3, 4, 5, 6]
        assert locks == []
        fill(other, 2)
        assert led.append(draft()).seq == 9  # sealed onto 6, collided with 7, redone
        assert locks == ["acme"]
        assert [led.append(draft()).seq for _ in range(2)] == [10, 11]
        assert locks == ["acme"] * 3
        assert led.verify("acme").ok


def test_nothing_sealed_on_a_stale_kept_head_leaves_the_chain_alone(db_url: str) -> None:
    """A batch whose only draft cannot be sealed must not write back a kept head that
    another writer has moved past (the head row would fall behind its receipts)."""
    migrated(db_url)
    with ledger(db_url) as led_a, ledger(db_url) as led_b:
        fill(led_a, 2)
        fill(led_b, 3)
        with pytest.raises(ReceiptFormatError, match="canonical"):
            led_a.append(draft(arguments={"city": "Paris", "days": float("nan")}))
        with attacker(db_url) as conn:
            assert conn.exec_driver_sql("SELECT head_seq FROM chains").scalar_one() == 5
        with ledger(db_url) as newcomer:  # no kept head: it reads the row under the lock
            assert newcomer.append(draft()).seq == 6
        assert led_a.append(draft()).seq == 7
        assert led_a.verify("acme").ok


def test_timer_checkpoint_covers_appends_after_another_writers_checkpoint(
    fresh_sqlite_url: str,
) -> None:
    """The due time computed from a kept head's (stale) checkpoint columns is only a hint:
    when the locked read says it is not due yet, the chain is rescheduled, not forgotten."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url, checkpoint_interval_s=3.0) as led:
        led.append(draft())  # signs 1: the chain's first checkpoint is due at once
        led.append(draft())
        time.sleep(1.5)
        led.checkpoint_now("acme")  # signs 2 on its own connection, as another writer would
        led.append(draft())  # sealed onto the kept head, which still says "signed 1, at t0"
        assert led.latest_checkpoint("acme")["tree_size"] == 2
        assert wait_for_checkpoint(led, "acme", 3)
        led.append(draft())
    with ledger(fresh_sqlite_url) as reader:
        assert reader.latest_checkpoint("acme")["tree_size"] == 4  # signed on close


def test_checkpoint_now_never_unschedules_a_later_append(fresh_sqlite_url: str) -> None:
    """An append committed while checkpoint_now (another thread) finishes is still covered
    by the timer checkpoint and on close."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url, checkpoint_interval_s=1.0) as led:
        led.append(draft())
        led.append(draft())
        sign, caller = led._writer._save_checkpoint_and_commit, threading.current_thread()

        def sign_then_append(conn: sa.Connection, head: object) -> dict:
            checkpoint = sign(conn, head)
            if threading.current_thread() is caller:  # not the writer's own timer checkpoint
                led.append(draft())  # the writer commits seq 3 before checkpoint_now returns
            return checkpoint

        led._writer._save_checkpoint_and_commit = sign_then_append
        assert led.checkpoint_now("acme")["tree_size"] == 2
        assert wait_for_checkpoint(led, "acme", 3)


def test_timer_checkpoint_while_other_chains_are_busy(fresh_sqlite_url: str) -> None:
    """A quiet chain gets its time-based checkpoint even when appends to another chain keep
    the writer from ever idling for a whole tick."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url, checkpoint_interval_s=1.0) as led:
        led.append(draft("quiet"))  # signs 1
        led.append(draft("quiet"))  # due a second later, by time
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            led.append(draft("busy"))
            time.sleep(0.2)
        assert led.latest_checkpoint("quiet")["tree_size"] == 2


def test_cancelled_appends_do_not_stop_the_writer(fresh_sqlite_url: str) -> None:
    """A caller that gives up (a cancelled future, e.g. its asyncio task was cancelled) must
    not take the writer thread down with it: later appends still commit."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        led.append(draft())
        blocker = sqlite3.connect(fresh_sqlite_url.split("///", 1)[1], isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the writer's next commit waits for this lock
        taken = led.submit(draft())
        time.sleep(0.3)  # the writer has taken it and waits for the lock
        futures = [led.submit(draft()) for _ in range(20)]
        assert all(future.cancel() for future in futures)  # none was taken yet
        blocker.rollback()
        blocker.close()
        assert taken.result(timeout=30).seq == 2
        assert led.submit(draft()).result(timeout=30).seq == 3  # the writer is alive
        assert led.verify("acme").ok


def test_two_writers_on_three_chains_under_load(fresh_postgres_url: str) -> None:
    """Kept and locked batches over several chains from two writers at once: every lock is
    taken in one order before any insert, so no deadlock, no refused append, no fork."""
    migrated(fresh_postgres_url)
    chains = ("x", "y", "z")
    for round_no in range(3):  # fresh writers each round: each starts with kept heads again
        with ledger(fresh_postgres_url) as led_a, ledger(fresh_postgres_url) as led_b:

            def work(led: Ledger, offset: int) -> None:
                for i in range(12):
                    batch = [chains[(i + offset + k) % 3] for k in range(3)]
                    for future in [led.submit(draft(chain)) for chain in batch]:
                        future.result(timeout=30)

            threads = [
                threading.Thread(target=work, args=(led, n))
                for n, led in enumerate((led_a, led_b, led_a, led_b))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for chain in chains:
                report = led_a.verify(chain)
                assert report.ok and report.checked == 48 * (round_no + 1), report


def wait_for_checkpoint(led: Ledger, chain: str, size: int, timeout: float = 10) -> bool:
    """Whether the chain's latest signed checkpoint reaches ``size`` within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if led.latest_checkpoint(chain)["tree_size"] >= size:
            return True
        time.sleep(0.1)
    return False


def test_writer_reconnects_after_an_idle_disconnect(fresh_postgres_url: str) -> None:
    """The writer keeps its connection between batches; when the server dropped it while
    idle (a restart, an idle timeout), the next append still succeeds."""
    migrated(fresh_postgres_url)
    with ledger(fresh_postgres_url) as led:
        fill(led, 2)
        assert on_server(fresh_postgres_url, TERMINATE_BACKENDS) >= 1
        time.sleep(1.2)  # longer than the writer's idle spell before a ping
        assert led.append(draft()).seq == 3
        assert led.verify("acme").ok


def test_verify_while_receipts_are_appended_reads_one_snapshot(fresh_postgres_url: str) -> None:
    """Verification reads the head, the receipts and the index rows in several statements;
    at Postgres's default READ COMMITTED, appends committed in between made about one run in
    four under load report tampering ("stored beyond the chain head")."""
    url = migrated(fresh_postgres_url)
    with ledger(url) as led:
        fill(led, 20)
        stop = threading.Event()

        def append() -> None:
            for _ in range(60):  # at most 480 more: each verification reads the whole chain
                if stop.is_set():
                    return
                fill(led, 8)

        appender = threading.Thread(target=append)
        appender.start()
        try:
            reports = [led.verify("acme") for _ in range(15)]
        finally:
            stop.set()
            appender.join()
        assert [r.reason for r in reports if not r.ok] == []
        assert reports[-1].checked > reports[0].checked  # the chain did grow meanwhile


def test_whole_chain_work_stops_between_receipts_when_asked(db_url: str, tmp_path: Path) -> None:
    """A verification or export whose caller has gone (the gateway's client disconnected)
    gives its thread back at the next receipt instead of at the chain's end."""
    url = migrated(db_url)
    with ledger(url) as led:
        fill(led, 5)
        asked: list[int] = []

        def after_three() -> bool:
            asked.append(1)
            return len(asked) > 3

        with pytest.raises(Stopped, match="stopped at seq 4"):
            led.verify("acme", should_stop=after_three)
        asked.clear()
        with pytest.raises(Stopped, match="stopped at seq 4"):
            led.export("acme", tmp_path / "bundle.tar.gz", should_stop=after_three)
        assert led.verify("acme", should_stop=lambda: False).checked == 5


def test_a_writer_stalled_inside_its_transaction_does_not_hold_the_other_replicas(
    fresh_postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A stalls for 12 s between locking the chain's head and writing (a SIGSTOP, a
    paused VM: its session stays alive). The server ends A's session after
    idle_in_transaction_session_timeout, so replica B appends within seconds, A's batch fails
    closed, and the chain stays whole."""
    url = migrated(fresh_postgres_url)
    stalled = threading.Event()
    real_seal = ledger_writer.seal

    def seal_once_slowly(*args: Any, **kwargs: Any) -> Any:
        if not stalled.is_set():
            stalled.set()
            time.sleep(12)
        return real_seal(*args, **kwargs)

    monkeypatch.setattr(ledger_writer, "seal", seal_once_slowly)
    with ledger(url) as a, ledger(url) as b:
        held = a.submit(draft())
        assert stalled.wait(10)
        started = time.monotonic()
        assert b.append(draft()).seq == 1
        assert time.monotonic() - started < store.WRITER_IDLE_IN_TRANSACTION_S + 4
        with pytest.raises(LedgerUnavailable):
            held.result(timeout=30)
        assert a.append(draft()).seq == 2  # A carries on once it runs again
        assert b.verify("acme").ok


def test_a_writer_session_ends_when_its_host_stops_answering(fresh_postgres_url: str) -> None:
    """A writer that stalls while its pipelined writes are on their way leaves its session
    active, not idle, holding the chain's lock (found by a replicas prober): the server's
    keepalives end it once the writer's host stops answering (a partition, a paused VM),
    and on Postgres 17 transaction_timeout ends it whatever the stall. Here: what the
    writer's sessions carry, as the server reports it on a TCP connection."""
    migrated(fresh_postgres_url)
    with ledger(fresh_postgres_url) as led, led._writer._engine.connect() as conn:
        shown = {
            name: conn.exec_driver_sql(f"SHOW {name}").scalar() for name in store.WRITER_KEEPALIVES
        }
        assert shown == {name: str(value) for name, value in store.WRITER_KEEPALIVES.items()}
        if int(conn.exec_driver_sql("SHOW server_version_num").scalar()) >= 170000:
            timeout = conn.exec_driver_sql("SHOW transaction_timeout").scalar()
            assert timeout == f"{store.WRITER_TRANSACTION_TIMEOUT_S}s"


@pytest.mark.parametrize("has_poll", [True, False], ids=["poll", "select-as-on-windows"])
def test_writer_notices_at_once_that_the_server_closed_its_connection(
    fresh_postgres_url: str, monkeypatch: pytest.MonkeyPatch, has_poll: bool
) -> None:
    """A session the server cut moments ago (a failover, pg_terminate_backend) is noticed
    before the next append uses it, not by failing that append: no idle ping helps here."""
    monkeypatch.setattr("receipts.writer_connection.IDLE_PING_S", 3600.0)
    if not has_poll:
        monkeypatch.delattr("select.poll")
    migrated(fresh_postgres_url)
    with ledger(fresh_postgres_url) as led:
        fill(led, 2)
        assert on_server(fresh_postgres_url, TERMINATE_BACKENDS) >= 1
        deadline = time.monotonic() + 10  # the backends end after pg_terminate_backend returns
        while on_server(fresh_postgres_url, COUNT_BACKENDS) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert led.append(draft()).seq == 3
        assert led.verify("acme").ok


def test_duplicate_call_id_fails_alone(db_url: str) -> None:
    migrated(db_url)
    with ledger(db_url) as led:
        taken = call_id()
        first = led.append(draft(call=taken))
        futures = [led.submit(draft()) for _ in range(5)]
        clash = led.submit(draft(call=taken))
        futures += [led.submit(draft()) for _ in range(5)]
        with pytest.raises(ReceiptFormatError, match=f"{taken} is already recorded.*seq 1"):
            clash.result()
        assert sorted(f.result().seq for f in futures) == list(range(2, 12))
        assert led.find_call("acme", taken) == first
        assert led.verify("acme").ok


def test_unsealable_draft_fails_alone(fresh_sqlite_url: str) -> None:
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        good = [led.submit(draft()) for _ in range(3)]
        bad = led.submit(draft(arguments={"city": "Paris", "days": float("nan")}))
        good += [led.submit(draft()) for _ in range(3)]
        with pytest.raises(ReceiptFormatError, match="canonical"):
            bad.result()
        assert sorted(f.result().seq for f in good) == list(range(1, 7))
        assert led.verify("acme").ok


def test_payloads_are_dropped_unless_retained(fresh_sqlite_url: str) -> None:
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        assert "payload_json" not in led.append(draft(payload=PAYLOAD)).request
    with ledger(fresh_sqlite_url, retain_payloads=True) as led:
        kept = led.append(draft(payload=PAYLOAD))
        texts = {"messages": '[{"role": "user", "content": "hi"}]', "params": '{"n": 1}'}
        assert kept.request["payload_json"] == texts
        assert led.get("acme", kept.id).request["payload_json"] == texts


PAYLOAD = {"messages": [{"role": "user", "content": "hi"}], "params": {"n": 1}}


def test_concurrent_submits_and_bad_input(fresh_sqlite_url: str) -> None:
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:

        async def many() -> list[int]:  # as the gateway awaits its commits
            futures = [asyncio.wrap_future(led.submit(draft())) for _ in range(20)]
            return [r.seq for r in await asyncio.gather(*futures)]

        assert sorted(asyncio.run(many())) == list(range(1, 21))
        with pytest.raises(ReceiptFormatError, match="ReceiptDraft"):
            led.append({"tenant": "acme"})  # type: ignore[arg-type]
    with pytest.raises(ReceiptsError, match="closed"):
        led.append(draft())
    with Ledger(fresh_sqlite_url, None) as reader:
        assert reader.verify("acme").ok
        with pytest.raises(ReadOnlyLedger, match="without a signer: it cannot append"):
            reader.append(draft())
        with pytest.raises(ReadOnlyLedger, match="without a signer: it cannot sign"):
            reader.checkpoint_now("acme")


def test_unmigrated_database_is_unavailable_not_created(fresh_sqlite_url: str) -> None:
    with ledger(fresh_sqlite_url) as led:
        with pytest.raises(LedgerUnavailable):
            led.append(draft())
        with pytest.raises(LedgerUnavailable):
            led.query(ReceiptQuery("acme"))


def test_database_outage_fails_closed_then_recovers(fresh_postgres_url: str) -> None:
    """Every pending append fails with LedgerUnavailable while the database refuses
    connections; nothing is half-written; appends succeed again once it is back."""
    migrated(fresh_postgres_url)
    with ledger(fresh_postgres_url) as led:
        fill(led, 10)
        on_server(fresh_postgres_url, 'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        on_server(fresh_postgres_url, TERMINATE_BACKENDS)
        futures = [led.submit(draft()) for _ in range(20)]
        for future in futures:
            with pytest.raises(LedgerUnavailable):
                future.result(timeout=30)
        with pytest.raises(LedgerUnavailable):
            led.ping()
        on_server(fresh_postgres_url, 'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        led.ping()
        assert fill(led, 5)[-1].seq == 15  # nothing of the failed batch was written
        assert led.verify("acme").ok


def test_read_only_database_is_not_up(fresh_postgres_url: str) -> None:
    """A database whose sessions start read-only (a standby after a failover) answers reads
    but takes no receipt: ping says so, appends fail closed, and both recover with writes."""
    migrated(fresh_postgres_url)
    with ledger(fresh_postgres_url) as led:
        fill(led, 3)
        on_server(
            fresh_postgres_url, 'ALTER DATABASE "{db}" SET default_transaction_read_only = on'
        )
        on_server(fresh_postgres_url, TERMINATE_BACKENDS)
        with pytest.raises(LedgerUnavailable, match="read-only"):
            led.ping()
        with pytest.raises(LedgerUnavailable):
            led.append(draft())
        assert len(led.query(ReceiptQuery("acme")).items) == 3  # reads still answer
        on_server(fresh_postgres_url, 'ALTER DATABASE "{db}" RESET default_transaction_read_only')
        on_server(fresh_postgres_url, TERMINATE_BACKENDS)
        led.ping()
        assert fill(led, 1)[-1].seq == 4


def test_an_append_its_caller_gave_up_on_while_the_lock_was_held_is_never_sealed(
    fresh_sqlite_url: str,
) -> None:
    """The caller's deadline passes while the writer waits for the database's write lock
    (another process holds it): the caller answers 503, so its receipt must not commit when
    the lock frees, as it did once the writer had taken the draft into its batch."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        fill(led, 2)
        holder = sqlite3.connect(fresh_sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        abandoned = led.submit(draft())
        deadline = time.monotonic() + 10
        while led.queued_appends():  # until the writer has taken it (then it waits for the lock)
            assert time.monotonic() < deadline, "the writer never took the draft"
            time.sleep(0.01)
        assert abandoned.cancel()  # what the gateway's db_timeout_s does
        holder.execute("ROLLBACK")
        holder.close()
        assert led.append(draft()).seq == 3
        assert led.verify("acme").ok


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_sqlite_file_removed_or_replaced_while_open_fails_closed(
    fresh_sqlite_url: str, how: str
) -> None:
    """The open connection would go on committing into the unlinked file (200s whose receipts
    no restart finds): appends, reads and ping refuse instead, naming the file, and neither
    they nor the checkpoint timer make a new empty file at the path."""
    migrated(fresh_sqlite_url)
    path = Path(fresh_sqlite_url.removeprefix("sqlite:///"))
    with ledger(fresh_sqlite_url, checkpoint_interval_s=0.1) as led:
        fill(led, 2)
        moved = path.with_name("moved.db")
        path.rename(moved)
        if how == "replaced":  # a restore copied over it: another file at the same path
            shutil.copy(moved, path)
        with pytest.raises(LedgerUnavailable, match=f"{path} was {how}"):
            led.append(draft())
        with pytest.raises(LedgerUnavailable, match=f"{path} was {how}"):
            led.ping()
        with pytest.raises(LedgerUnavailable, match=f"{path} was {how}"):
            led.query(ReceiptQuery("acme"))
        time.sleep(1.5)  # the checkpoint timer's ticks, with the chain's checkpoint due
        assert path.exists() == (how == "replaced")


def test_a_draft_given_up_on_survives_a_failed_commit(fresh_sqlite_url: str) -> None:
    """A draft cancelled while the writer waited for the lock, in a batch whose commit then
    fails: the writer skipped it once and must skip it again when failing the batch (asking
    a cancelled future twice raised, and killed the writer thread: every later append hung)."""
    migrated(fresh_sqlite_url)
    path = fresh_sqlite_url.removeprefix("sqlite:///")
    with ledger(fresh_sqlite_url) as led:
        fill(led, 2)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        abandoned, waited_for = led.submit(draft()), led.submit(draft())
        time.sleep(0.5)  # both taken into one batch, waiting for the lock
        assert abandoned.cancel()
        subprocess.run(["chattr", "+i", f"{path}-wal"], check=True)  # the commit will fail
        try:
            holder.execute("ROLLBACK")
            holder.close()
            with pytest.raises(LedgerUnavailable):  # its caller is told, not left waiting
                waited_for.result(timeout=30)
        finally:
            subprocess.run(["chattr", "-i", f"{path}-wal"], check=True)
        assert led.submit(draft()).result(timeout=30).seq == 3
        assert led.verify("acme").ok


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_writer_thread_is_named_not_waited_for(
    fresh_sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the writer thread ever dies, appends and ping say so at once instead of queueing
    receipts for nobody (every caller a 503 after db_timeout_s, /readyz still ready)."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        fill(led, 1)

        def die(batch: Any) -> None:
            raise SystemExit  # what no guard in the thread catches

        monkeypatch.setattr(led._writer, "_commit", die)
        led.submit(draft())
        led._writer._thread.join(timeout=10)
        with pytest.raises(LedgerUnavailable, match="writer thread has stopped"):
            led.submit(draft())
        with pytest.raises(LedgerUnavailable, match="writer thread has stopped"):
            led.ping()


def test_a_writer_stuck_in_a_commit_is_not_ready(
    fresh_sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that never ends (a synchronous standby gone: reads answer, commits wait)
    passed every ping while no receipt could land; ping now names a writer that has been
    inside one transaction for longer than it is told to allow."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        led.ping(stalled_after_s=0.5)  # idle: ready
        sealing, release = hold_sealing(monkeypatch)
        pending = led.submit(draft())
        assert sealing.wait(30)
        time.sleep(0.6)
        try:
            with pytest.raises(LedgerUnavailable, match=r"waited \d+\.\d s for one transaction"):
                led.ping(stalled_after_s=0.5)
            led.ping()  # no limit given: the database itself answers
        finally:
            release.set()
        assert pending.result(timeout=30).seq == 1
        led.ping(stalled_after_s=0.5)


def test_appends_from_many_threads(fresh_sqlite_url: str) -> None:
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        seqs: list[int] = []
        lock = threading.Lock()

        def work() -> None:
            for _ in range(25):
                seq = led.append(draft()).seq
                with lock:
                    seqs.append(seq)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(seqs) == list(range(1, 201))
        assert led.verify("acme").ok


def test_union_in_kit_binds_like_the_gateway() -> None:
    """The kit's union has the shape binding.py resolves tools in (guards the fixtures)."""
    from receipts.binding import tool_pointers

    pointers = tool_pointers(UNION)
    assert pointers == {
        "get_weather": "#/anyOf/0/properties/arguments",
        "search": "#/anyOf/1/properties/arguments",
    }
    assert UNION["anyOf"][0]["properties"]["arguments"] == WEATHER_PARAMS
    assert UNION["anyOf"][1]["properties"]["arguments"] == SEARCH_PARAMS


def test_a_retained_payload_must_hash_to_its_digests() -> None:
    """payload_json is checked against messages_sha256 and params_sha256 (Receipt parsing,
    so every read and every verifier does); no other member may carry the request (the
    unchecked `payload` of early builds is refused)."""
    messages, params = [{"role": "user", "content": "hi"}], {"model": "m", "tools": []}
    texts = {"messages": json.dumps(messages), "params": json.dumps(params)}
    good = {
        "messages_sha256": hash_json(messages),
        "params_sha256": hash_json(params),
        "payload_json": texts,
    }
    check_request(good)
    for broken in (
        {**good, "payload_json": {**texts, "params": json.dumps({"model": "other"})}},
        {**good, "payload_json": {**texts, "messages": "[not json"}},
        {**good, "payload_json": {**texts, "messages": json.dumps({"role": "user"})}},
    ):
        with pytest.raises(ReceiptFormatError, match="request.payload_json"):
            check_request(broken)
    with pytest.raises(ReceiptFormatError, match="payload"):
        check_request({**good, "payload": {"messages": messages, "params": params}})
    caller = {"api_key_id": "key_0123456789abcdef", "request_id": "req_" + "0" * 24}
    check_request({**good, **caller})
    for member, bad in (("api_key_id", "cp_secret"), ("request_id", "req_1\n"), ("request_id", 7)):
        with pytest.raises(ReceiptFormatError, match=f"request.{member}"):
            check_request({**good, **caller, member: bad})


def test_a_closed_ledger_is_unavailable(fresh_sqlite_url: str) -> None:
    """An append that lands while the gateway shuts down fails closed as a database outage
    does (503), not as an unhandled error (500)."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        led.close()
        with pytest.raises(LedgerUnavailable, match="closed"):
            led.append(draft())


def test_a_verification_no_checkpoint_anchors_says_so(fresh_sqlite_url: str) -> None:
    """Every stored checkpoint gone (as one who can write the database can make it): the
    links still verify, and the report says that the root, and so the tail, went unchecked."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        fill(led, 3)
        assert all("not checked" not in note for note in led.verify("acme").notes)
    with attacker(fresh_sqlite_url) as conn:
        conn.execute(sa.text("DELETE FROM checkpoints"))
    with ledger(fresh_sqlite_url) as led:
        report = led.verify("acme")
    assert report.ok and report.tree_size is None
    assert "Merkle root was not checked" in report.notes[-1]


def test_a_verification_says_which_receipts_no_signed_checkpoint_covers_yet(
    fresh_sqlite_url: str,
) -> None:
    """The chain's newest receipts wait for the next checkpoint: the report said "5 receipts
    verified (seq 1..5 of tree size 3)" and nothing about 4..5."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        led.append(draft())  # a chain's first batch is checkpointed at once
        assert led.latest_checkpoint("acme")["tree_size"] == 1
        fill(led, 2)
        report = led.verify("acme")
        assert report.ok and (report.tree_size, report.last_seq) == (1, 3)
        assert "seq 2..3 are past the latest signed checkpoint (tree size 1)" in report.notes[-1]


def test_a_saved_checkpoint_is_checked_whatever_range_is_verified(fresh_sqlite_url: str) -> None:
    """The auditor's checkpoint at tree size 6, a chain of 10: a range ending before 6 read as
    "truncated since it was saved" and one starting after it as predating the range, though
    the stored tree proves either consistent with the saved root. Now each passes, and a
    history rewritten since it was saved still fails, through the range's own receipts."""
    migrated(fresh_sqlite_url)
    signer = Signer.generate()
    ranges = [(None, None), (None, 3), (2, 5), (3, 6), (7, 9), (8, 10), (8, None)]
    with ledger(fresh_sqlite_url, signer) as led:
        fill(led, 6)
        saved = led.checkpoint_now("acme")
        fill(led, 4)
        for from_seq, to_seq in ranges:
            report = led.verify("acme", from_seq, to_seq, saved=[saved])
            assert report.ok, (from_seq, to_seq, report)
            assert any("saved checkpoint" in note for note in report.notes), report.notes
        assert any(
            "outside seq 1..3" in note for note in led.verify("acme", 1, 3, saved=[saved]).notes
        )
        other = make_checkpoint("acme", 6, led.checkpoint_now("acme")["root_hash"], signer)
        for from_seq, to_seq in ranges:  # signed by the operator's key, but another history
            report = led.verify("acme", from_seq, to_seq, saved=[other])
            assert not report.ok and "saved checkpoint" in report.reason, (from_seq, to_seq)
        beyond = make_checkpoint("acme", 12, saved["root_hash"], signer)  # cut back since
        report = led.verify("acme", None, 3, saved=[beyond])
        assert not report.ok and "truncated since it was saved" in report.reason, report
        unsigned = {
            **saved,
            "signature": make_checkpoint("acme", 5, "ab" * 32, signer)["signature"],
        }
        for from_seq, to_seq in ranges:  # the saved root, but not its signature
            report = led.verify("acme", from_seq, to_seq, saved=[unsigned])
            assert not report.ok, (from_seq, to_seq, report)
            assert "signature does not verify" in report.reason, (from_seq, to_seq, report)


def test_a_range_past_the_latest_checkpoint_verifies(fresh_sqlite_url: str) -> None:
    """from_seq past the latest checkpoint's size, to the head: the chain verified intact
    only with to_seq given; without, "checkpoint predates the first receipt checked"."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        fill(led, 6)
        led.checkpoint_now("acme")
        fill(led, 4)
        report = led.verify("acme", 8)
    assert report.ok and (report.first_seq, report.last_seq) == (8, 10), report
    assert "no signed checkpoint covers these receipts" in report.notes[-1]


def test_a_checkpoint_of_another_tenant_is_named_as_such(fresh_sqlite_url: str) -> None:
    """The stored keys record their turns per chain, so another tenant's checkpoint read as
    signed "by a retired key"; it is of another chain."""
    migrated(fresh_sqlite_url)
    with ledger(fresh_sqlite_url) as led:
        fill(led, 3)
        fill(led, 2, "globex")
        theirs = led.checkpoint_now("globex")
        for from_seq, to_seq in [(None, None), (1, 2), (3, 3)]:
            report = led.verify("acme", from_seq, to_seq, saved=[theirs])
            assert not report.ok and "for chain 'globex', not 'acme'" in report.reason, report


def _backup(url: str, name: str) -> str:
    """A copy of the live database as a backup would take it: SQLite's backup API (the file
    may have pages in its WAL); on Postgres a clone, once the ledger's sessions are cut."""
    if url.startswith("sqlite"):
        target = Path(url.split("///", 1)[1]).with_name(name + ".db")
        with (
            closing(sqlite3.connect(url.split("///", 1)[1])) as live,
            closing(sqlite3.connect(target)) as copy,
        ):
            live.backup(copy)
        return f"sqlite:///{target}"
    _cut_sessions(url)
    return clone(url, name)


def _restore(url: str, backup: str) -> None:
    """Put ``backup`` in place of the live database under a running ledger: SQLite's backup
    API into the same file (the file identity check does not see it); on Postgres the live
    database renamed away and the backup renamed into its name, as a restore to a new
    cluster would look to a gateway that reconnects."""
    if url.startswith("sqlite"):
        with (
            closing(sqlite3.connect(backup.split("///", 1)[1])) as copy,
            closing(sqlite3.connect(url.split("///", 1)[1])) as live,
        ):
            copy.backup(live)
        return
    db = url.rsplit("/", 1)[1]
    for attempt in range(50):  # the ledger's checkpoint timer may reconnect in between
        _cut_sessions(url)
        try:
            on_server(url, f'ALTER DATABASE "{db}" RENAME TO "{db}_lost"')
            break
        except sa.exc.OperationalError:
            if attempt == 49:
                raise
    on_server(url, f'ALTER DATABASE "{backup.rsplit("/", 1)[1]}" RENAME TO "{db}"')


def _cut_sessions(url: str) -> None:
    on_server(url, TERMINATE_BACKENDS)
    deadline = time.monotonic() + 10  # the backends end after pg_terminate_backend returns
    while on_server(url, COUNT_BACKENDS) and time.monotonic() < deadline:
        time.sleep(0.02)


def _five_backed_up_at_three(led: Ledger, url: str) -> str:
    """Five receipts on acme, with a backup taken after the third: the URL of that backup."""
    fill(led, 3)
    backup = _backup(url, "backup_" + uuid.uuid4().hex[:8])
    fill(led, 2)
    return backup


def test_a_database_restored_under_a_running_ledger_is_neither_extended_nor_signed(
    db_url: str,
) -> None:
    """A restore from a backup (or a standby that lagged, promoted) while the gateway runs:
    the chain's head goes back below receipts whose callers hold them and a checkpoint this
    key signed. Sealing those seqs again would sign a second history under the same key, so
    the chain is refused (a 503) until the ledger restarts; other chains go on."""
    url = migrated(db_url)
    signer = Signer.generate()
    with ledger(url, signer) as led:
        backup = _five_backed_up_at_three(led, url)
        assert led.checkpoint_now("acme")["tree_size"] == 5
        _restore(url, backup)
        with pytest.raises(ChainBehind, match="went back from seq 5 to seq 3"):
            led.append(draft())
        with pytest.raises(ChainBehind, match="went back from seq 5 to seq 3"):
            led.checkpoint_now("acme")
        assert led.append(draft("beta")).seq == 1
    with ledger(url, signer) as led:  # restarted: the operator chose to go on without them
        assert [r.seq for r in fill(led, 3)] == [4, 5, 6]  # from the head it has, no gap
        assert led.verify("acme").ok


def test_a_chain_restored_then_regrown_by_another_writer_is_refused_too(db_url: str) -> None:
    """After the restore another writer (a replica that had not seen the lost receipts)
    appends until the head is back at the seq this ledger saw, with other receipts: the
    kept head's compare-and-set must not pass on the seq alone, nor the high-water mark."""
    url = migrated(db_url)
    with ledger(url) as led:
        backup = _five_backed_up_at_three(led, url)
        _restore(url, backup)
        with ledger(url, Signer.generate()) as replica:
            assert [r.seq for r in fill(replica, 2)] == [4, 5]
        with pytest.raises(ChainBehind, match="holds another receipt at seq 5 than the one"):
            led.append(draft())
        assert led.verify("acme").ok  # nothing was sealed onto the other history
