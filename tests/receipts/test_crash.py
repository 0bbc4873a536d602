"""A writer killed with SIGKILL in the middle of its batches leaves a chain that verifies and
holds every receipt whose append returned; the next writer carries the chain on."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

from ledger_kit import append_worker, draft, ledger, migrated

from receipts.signing import Signer

RETURNED_BEFORE_KILL = 300


def test_sigkill_mid_batch_loses_no_returned_receipt(db_url: str) -> None:
    url = migrated(db_url)
    signer = Signer.generate()
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    # far more appends than it will live to make, many in flight: it dies inside a batch
    writer = ctx.Process(
        target=append_worker, args=(url, signer.private_key_pem(), 100_000, send, "acme", 200)
    )
    writer.start()
    send.close()
    returned: dict[str, int] = {}
    while len(returned) < RETURNED_BEFORE_KILL:
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

    with ledger(url, signer) as led:
        report = led.verify("acme")
        assert report.ok, report
        assert report.checked >= len(returned)
        for receipt_id, seq in returned.items():
            stored = led.get("acme", receipt_id)
            assert stored is not None and stored.seq == seq
        survivor = led.append(draft())
        assert survivor.seq == report.checked + 1
        assert led.verify("acme").ok
