"""How the gateway reads the ledger: off the event loop, within the database timeout, and for
an auditor only ever its own tenant's chain.

`LedgerRead` is the policy (which threads, how long, how many whole-chain jobs per tenant);
`TenantChain` is the per-request view the audit controller holds, with the tenant taken from
the key, never from the request, so an auditor cannot even learn whether another tenant's
receipt id exists: it is simply "not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from litestar.di import NamedDependency
from litestar.types import Receive

from gateway.apikeys import ApiKey
from gateway.deadline import within_db_timeout
from gateway.disconnect import unless_client_leaves
from gateway.errors import APIError
from gateway.pipe import ThreadPipe
from receipts.chain import VerificationReport
from receipts.errors import BundleTooLarge, LedgerUnavailable, OutOfRange, ReceiptFormatError
from receipts.ledger import Ledger, ReceiptPage, ReceiptQuery
from receipts.ledger_proofs import ConsistencyProof, InclusionProof
from receipts.record import Receipt
from receipts.signing import PublicKeyEntry

T = TypeVar("T")
log = logging.getLogger("callproof.gateway")


class LedgerRead:
    """Runs ledger reads off the event loop, each within db_timeout_s: a database that hangs
    fails closed (503 ledger_unavailable) as one that is down does. Verification and export
    stream a whole chain and take what they take (`unbounded`), on threads of their own: on
    the shared default executor, six of them left no thread for any tenant's key lookup, and
    the whole gateway answered 503."""

    def __init__(self, timeout_s: float, chain_workers: int = 2):
        self.timeout_s = timeout_s
        self._chain_work = ThreadPoolExecutor(chain_workers, thread_name_prefix="audit-chain")
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # tenants with a whole-chain job queued or running

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        call = _in_context(fn, *args)
        with _refusals_are_400():
            run = asyncio.get_running_loop().run_in_executor(None, call)
            return await within_db_timeout(
                run, self.timeout_s, LedgerUnavailable, "the ledger database"
            )

    async def unbounded(self, tenant: str, receive: Receive, fn: Callable[..., T], *args: Any) -> T:
        """Whole-chain work: ``fn(*args, should_stop=...)``, at most chain_workers at once
        (more wait their turn) and one of a tenant's running or waiting (a second is a 429:
        a tenant cannot queue whole-chain work in front of the others). When
        the client disconnects (a 499) or the request is cancelled, ``should_stop`` turns
        true and the thread gives up at its next receipt."""
        future, stop = self._start(tenant, fn, *args)
        try:
            with _refusals_are_400():
                return await unless_client_leaves(receive, asyncio.wrap_future(future))
        finally:
            stop.set()  # a no-op once done; else the thread stops at its next receipt

    async def streamed(
        self, tenant: str, receive: Receive, fn: Callable[..., object]
    ) -> AsyncIterator[bytes]:
        """Whole-chain work that writes a file, ``fn(out, should_stop=...)``, taken as
        `unbounded` takes it, its bytes streamed as they are written. Returns once the
        first chunk is ready, so a failure before it is an ordinary error answer; one after
        it ends the stream unfinished, which its client sees as a broken download."""
        pipe = ThreadPipe()

        def write(should_stop: Callable[[], bool]) -> None:
            try:
                fn(pipe, should_stop=should_stop)
                pipe.finish()  # its last chunk can find the reader stalled: Stopped
            except Exception as exc:  # noqa: BLE001 - the reader raises it, on the loop
                pipe.fail(exc)

        def dropped(job: Future[None]) -> None:
            if job.cancelled():  # never ran: `close` dropped the queued work at shutdown
                pipe.fail(LedgerUnavailable("the gateway is shutting down; retry the export"))

        future, stop = self._start(tenant, write)
        future.add_done_callback(dropped)
        ended = asyncio.wrap_future(future)

        async def read() -> bytes | None:
            """The next chunk; the last answer (the end, or the writer's error) only once
            the writer's thread has given back its tenant's turn: a client told its export
            is done, or refused, may start the next one at once, and did get a 429."""
            try:
                chunk = await pipe.read()
            except Exception:
                await asyncio.wait([ended])
                raise
            if chunk is None:
                await asyncio.wait([ended])
            return chunk

        try:
            with _refusals_are_400():
                first = await unless_client_leaves(receive, read())
        except BaseException:
            stop.set()
            pipe.close()
            raise
        return _rest(first, read, pipe, stop)

    def _start(
        self, tenant: str, fn: Callable[..., T], *args: Any
    ) -> tuple[Future[T], threading.Event]:
        """``fn(*args, should_stop=...)`` submitted to the whole-chain threads, counted to
        its tenant until it ends, and the event that asks it to stop."""
        with self._lock:
            if tenant in self._busy:
                raise APIError(
                    429,
                    "this tenant already has a verification or export running or waiting;"
                    " retry when it has finished",
                    code="rate_limit_exceeded",
                )
            self._busy.add(tenant)
        stop = threading.Event()
        try:
            future = self._chain_work.submit(_in_context(fn, *args, should_stop=stop.is_set))
        except BaseException:
            self._release(tenant)
            raise
        future.add_done_callback(lambda _: self._release(tenant))  # ran, failed or dropped
        return future, stop

    def _release(self, tenant: str) -> None:
        with self._lock:
            self._busy.discard(tenant)

    def close(self) -> None:
        self._chain_work.shutdown(wait=False, cancel_futures=True)


def _in_context(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Callable[[], T]:
    """``fn`` to run in a thread with the request's context (as asyncio.to_thread does, so
    its log lines name the request)."""
    return functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)


@contextlib.contextmanager
def _refusals_are_400() -> Iterator[None]:
    """What the ledger refuses on a read (a bad seq range, an export too large for one
    bundle) is the request's fault: a 400. Only here: the same errors from an append are the
    gateway's own fault, which error_for answers with a 500 and logs."""
    try:
        yield
    except (ReceiptFormatError, OutOfRange) as exc:
        raise APIError(400, str(exc), code="invalid_value") from None
    except BundleTooLarge as exc:
        raise APIError(400, str(exc), code="bundle_too_large") from None


async def _rest(
    first: bytes | None,
    read: Callable[[], Awaitable[bytes | None]],
    pipe: ThreadPipe,
    stop: threading.Event,
) -> AsyncIterator[bytes]:
    """The stream from its first chunk on. A failure now cannot become an error answer (the
    status is sent): it is logged, and raised so that the response ends unfinished rather than
    as a complete download of a truncated file."""
    try:
        chunk = first
        while chunk is not None:
            yield chunk
            chunk = await read()
    except Exception as exc:  # Stopped too, when the writer gave up on a client taking nothing
        log.error(
            "stream failed after its first byte",
            extra={"event": "stream_failed", "kind": type(exc).__name__, "detail": str(exc)},
        )
        raise
    finally:
        stop.set()
        pipe.close()


@dataclass(frozen=True)
class TenantChain:
    """One auditor's chain for one request: every ledger read names ``tenant`` (the key's)
    and runs through ``read``."""

    tenant: str
    ledger: Ledger
    read: LedgerRead

    async def query(self, **filters: Any) -> ReceiptPage:
        """Receipts matching ``filters`` (ReceiptQuery's fields but the tenant)."""
        return await self.read(self.ledger.query, ReceiptQuery(tenant=self.tenant, **filters))

    async def get(self, receipt_id: str) -> Receipt | None:
        return await self.read(self.ledger.get, self.tenant, receipt_id)

    async def find_call(self, call_id: str) -> Receipt | None:
        return await self.read(self.ledger.find_call, self.tenant, call_id)

    async def answers_to(self, call_id: str) -> ReceiptPage:
        return await self.read(self.ledger.answers_to, self.tenant, call_id)

    async def schema(self, schema_hash: str) -> dict[str, Any] | None:
        """The schema, if a receipt of this chain binds it: schemas are stored once for all
        tenants, and another tenant's must stay unknown here."""
        if not (await self.query(schema_hash=schema_hash, limit=1)).items:
            return None
        return await self.read(self.ledger.schema, schema_hash)

    async def public_keys(self) -> list[PublicKeyEntry]:
        return await self.read(self.ledger.chain_keys, self.tenant)

    async def reach(self) -> int:
        return await self.read(self.ledger.reach, self.tenant)

    async def latest_checkpoint(self) -> dict[str, Any] | None:
        return await self.read(self.ledger.latest_checkpoint, self.tenant)

    async def checkpoint_now(self) -> dict[str, Any]:
        return await self.read(self.ledger.checkpoint_now, self.tenant)

    async def inclusion_proof(self, seq: int, tree_size: int | None) -> InclusionProof:
        return await self.read(self.ledger.inclusion_proof, self.tenant, seq, tree_size)

    async def consistency_proof(self, first: int, second: int) -> ConsistencyProof:
        return await self.read(self.ledger.consistency_proof, self.tenant, first, second)

    async def verify_one(self, seq: int) -> VerificationReport:
        """Whether receipt ``seq`` verifies where it stands (a bounded read: one receipt)."""
        return await self.read(self.ledger.verify, self.tenant, seq, seq)

    async def verify(
        self,
        receive: Receive,
        from_seq: int | None,
        to_seq: int | None,
        saved: Sequence[Mapping[str, Any]],
    ) -> VerificationReport:
        """Verify a seq range as whole-chain work (see LedgerRead.unbounded)."""
        verify = functools.partial(self.ledger.verify, saved=saved)
        return await self.read.unbounded(
            self.tenant, receive, verify, self.tenant, from_seq, to_seq
        )

    async def export(
        self, receive: Receive, since: datetime | None, until: datetime | None
    ) -> AsyncIterator[bytes]:
        """The bundle of [since, until), streamed as it is written (see LedgerRead.streamed)."""
        write = functools.partial(self.ledger.export, self.tenant, since=since, until=until)
        return await self.read.streamed(self.tenant, receive, write)


def tenant_chain(
    principal: NamedDependency[ApiKey],
    ledger: NamedDependency[Ledger],
    read: NamedDependency[LedgerRead],
) -> TenantChain:
    """The ``chain`` dependency of the audit routes: the principal's own tenant's chain."""
    return TenantChain(principal.tenant, ledger, read)
