"""A writer stopped in the middle of its work: killed with SIGKILL inside a batch, or cut off
from the database around a COMMIT. The chain verifies and holds every receipt whose append
returned, an append learns whether its COMMIT landed, and the next writer carries the chain
on and signs what the killed one left unsigned."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from faults import PostgresProxy
from ledger_kit import append_worker, draft, fill, ledger, migrated

from receipts.errors import LedgerUnavailable
from receipts.signing import Signer

RETURNED_BEFORE_KILL = 300


def killed_writer(
    url: str, signer: Signer, returned_before_kill: int, window: int
) -> dict[str, int]:
    """Receipt id -> seq of every append a writer process returned before it was killed
    with SIGKILL: it is given far more appends than it lives to make, ``window`` in flight,
    so it dies inside a batch."""
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    writer = ctx.Process(
        target=append_worker, args=(url, signer.private_key_pem(), 100_000, send, "acme", window)
    )
    writer.start()
    send.close()
    returned: dict[str, int] = {}
    while len(returned) < returned_before_kill:
        receipt_id, seq = receive.recv()
        returned[receipt_id] = seq
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(timeout=30)
    assert writer.exitcode == -signal.SIGKILL
    while receive.poll():  # reports sent before the kill landed
        try:
            receipt_id, seq = receive.recv()
        except EOFError:
            break
        returned[receipt_id] = seq
    return returned


def test_sigkill_mid_batch_loses_no_returned_receipt(db_url: str) -> None:
    url = migrated(db_url)
    signer = Signer.generate()
    returned = killed_writer(url, signer, RETURNED_BEFORE_KILL, window=200)

    with ledger(url, signer, checkpoint_interval_s=1) as led:
        report = led.verify("acme")
        assert report.ok, report
        assert report.checked >= len(returned)
        for receipt_id, seq in returned.items():
            stored = led.get("acme", receipt_id)
            assert stored is not None and stored.seq == seq
        # The killed writer signed no checkpoint over its last receipts; a started ledger of
        # the same key signs one by its timer, before any append (it used to wait for one).
        led.start()
        deadline = time.monotonic() + 30
        while (led.latest_checkpoint("acme") or {}).get("tree_size") != report.checked:
            assert time.monotonic() < deadline, led.latest_checkpoint("acme")
            time.sleep(0.2)
        survivor = led.append(draft())
        assert survivor.seq == report.checked + 1
        assert led.verify("acme").ok


def test_a_replica_of_the_same_key_signs_what_a_killed_one_left_unsigned(db_url: str) -> None:
    """Two writers share the operator's key; one is killed with receipts no checkpoint
    covers. The one still running used to look for such chains only when it started, and
    left them unsigned until it was restarted; it now looks every checkpoint interval."""
    url = migrated(db_url)
    signer = Signer.generate()
    with ledger(url, signer, checkpoint_interval_s=1) as survivor:
        survivor.start()
        time.sleep(1.5)  # its first look (at its first tick, 1 s) finds no chain yet
        killed_writer(url, signer, 100, window=50)
        head = survivor.verify("acme").checked
        deadline = time.monotonic() + 30
        while (survivor.latest_checkpoint("acme") or {}).get("tree_size") != head:
            assert time.monotonic() < deadline, (head, survivor.latest_checkpoint("acme"))
            time.sleep(0.2)


@pytest.fixture
def proxy(fresh_postgres_url: str) -> Iterator[PostgresProxy]:
    migrated(fresh_postgres_url)
    proxy = PostgresProxy(sa.make_url(fresh_postgres_url).port)
    try:
        yield proxy
    finally:
        proxy.close()


def test_a_commit_whose_reply_is_lost_returns_the_receipt_that_landed(
    proxy: PostgresProxy, fresh_postgres_url: str
) -> None:
    """The connection breaks after COMMIT reached the server: the receipt landed, unheard.
    Its append used to fail (a 503 for a receipt the chain holds, and no late-commit line to
    reconcile them); the writer now asks the database, and the append returns it."""
    with ledger(proxy.url(fresh_postgres_url)) as led:
        fill(led, 1)
        proxy.cut_at_commit("after")
        receipt = led.submit(draft()).result(timeout=30)
        assert proxy.cut.is_set()
        assert receipt.seq == 2
        stored = led.get("acme", receipt.id)
        assert stored is not None and stored.entry_hash == receipt.entry_hash
        assert led.append(draft()).seq == 3
        assert led.verify("acme").ok


def test_a_commit_lost_on_its_way_fails_its_append(
    proxy: PostgresProxy, fresh_postgres_url: str
) -> None:
    """The connection breaks before COMMIT reached the server: nothing landed, so the append
    fails, and the next one takes the seq."""
    with ledger(proxy.url(fresh_postgres_url)) as led:
        fill(led, 1)
        proxy.cut_at_commit("before")
        with pytest.raises(LedgerUnavailable, match="could not commit"):
            led.submit(draft()).result(timeout=30)
        assert proxy.cut.is_set()
        assert led.append(draft()).seq == 2
        assert led.verify("acme").ok


def test_a_commit_in_doubt_waits_for_the_database_to_say(
    proxy: PostgresProxy, fresh_postgres_url: str
) -> None:
    """COMMIT landed unheard and the database is down when the writer asks: the append stays
    unresolved (its gateway caller gives up at db_timeout_s and logs the receipt as committed
    late once it resolves) until the database answers again."""
    with ledger(proxy.url(fresh_postgres_url)) as led:
        fill(led, 1)
        proxy.refusing.set()  # the writer's connection stays; a new one is refused
        proxy.cut_at_commit("after")
        pending = led.submit(draft())
        assert proxy.cut.wait(30)
        time.sleep(2.5)  # two ticks of the writer asking, refused
        assert not pending.done()
        proxy.refusing.clear()
        assert pending.result(timeout=30).seq == 2
        assert led.append(draft()).seq == 3
        assert led.verify("acme").ok


def test_a_commit_still_running_when_its_reply_is_lost_is_waited_for(
    proxy: PostgresProxy, fresh_postgres_url: str
) -> None:
    """The connection breaks while the server is still committing (a synchronous standby
    awaited, a slow disk: here a deferred trigger that sleeps): the receipt is not yet
    visible. The writer's check took it as not landed, and it landed a moment later with no
    late-commit line; the check now waits for the chain's head, which the committing
    transaction holds, and finds it."""
    with ledger(proxy.url(fresh_postgres_url)) as led:
        fill(led, 1)
        engine = sa.create_engine(fresh_postgres_url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql"
                    " AS $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$"
                )
                conn.exec_driver_sql(
                    "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON receipts"
                    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
                )
        finally:
            engine.dispose()
        proxy.cut_at_commit("after")  # cut 0.5 s after COMMIT went out: 1.5 s before it ends
        receipt = led.submit(draft()).result(timeout=30)
        assert proxy.cut.is_set()
        assert receipt.seq == 2
        assert led.verify("acme").ok
