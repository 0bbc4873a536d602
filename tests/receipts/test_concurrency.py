"""Several writer processes on one Postgres chain: the row lock serialises them, so the chain
never forks: seqs 1..N gapless, one chain, and it verifies."""

from __future__ import annotations

import multiprocessing as mp

from ledger_kit import append_worker, ledger, migrated

from receipts.signing import Signer

PROCESSES, EACH = 4, 500


def test_four_processes_one_chain(fresh_postgres_url: str) -> None:
    url = migrated(fresh_postgres_url)
    signer = Signer.generate()
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for _ in range(PROCESSES):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=append_worker, args=(url, signer.private_key_pem(), EACH, send))
        proc.start()
        send.close()
        pipes.append(receive)
        procs.append(proc)
    returned: list[tuple[str, int]] = []
    for receive in pipes:
        while (message := receive.recv()) is not None:
            returned.append(message)
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0

    assert sorted(seq for _, seq in returned) == list(range(1, PROCESSES * EACH + 1))
    assert len({receipt_id for receipt_id, _ in returned}) == PROCESSES * EACH
    with ledger(url, signer) as led:
        assert led.chains() == ["acme"]
        report = led.verify("acme")
        assert report.ok and report.checked == PROCESSES * EACH, report
        assert all(led.get("acme", rid).seq == seq for rid, seq in returned[::97])
