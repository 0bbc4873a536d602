"""The audit API (auditor keys only), always scoped to the auditor's own tenant chain.

Every read names the tenant from the key, never from the request, so an auditor cannot even
learn whether another tenant's receipt id exists: it is simply "not found". Ledger reads are
blocking database calls and run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Annotated, Any, TypeVar

from litestar import Controller, Request, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody, Parameter
from litestar.response import Stream
from litestar.types import Receive

from gateway.apikeys import ApiKey
from gateway.auth import BEARER, require_role
from gateway.bodies import StrictBody
from gateway.completion import Completions
from gateway.deadline import within_db_timeout
from gateway.disconnect import unless_client_leaves
from gateway.errors import BODY_ERRORS, APIError, documented
from gateway.openapi import GzipOperation, OptionalBodyOperation
from gateway.pipe import ThreadPipe
from gateway.query import shaped
from gateway.replay import replay
from gateway.schemas import CallRecord, ReceiptPage, ReplayReport, ReplayRequest, VerifyRequest
from gateway.shapes import CALL_ID, PRINTABLE, RECEIPT_ID, SHA256_HEX, TIME
from receipts import queries
from receipts.canonical import MAX_SAFE_INT  # seqs stay exact in every JSON reader
from receipts.chain import VerificationReport
from receipts.checkpoint import Checkpoint
from receipts.errors import ChainDamaged, LedgerUnavailable, OutOfRange, ReceiptFormatError
from receipts.ledger import Ledger, ReceiptQuery
from receipts.ledger_proofs import ConsistencyProof, InclusionProof
from receipts.record import Receipt
from receipts.signing import PublicKeyEntry

T = TypeVar("T")
log = logging.getLogger("callproof.gateway")
Timestamp = Annotated[str | None, shaped(TIME)]


class LedgerRead:
    """Runs ledger reads off the event loop, each within db_timeout_s: a database that hangs
    fails closed (503 ledger_unavailable) as one that is down does. Verification and export
    stream a whole chain and take what they take (`unbounded`), on threads of their own: on
    the shared default executor, six of them left no thread for any tenant's key lookup, and
    the whole gateway answered 503."""

    def __init__(self, timeout_s: float, chain_workers: int = 2, per_tenant: int = 1):
        self.timeout_s = timeout_s
        self.per_tenant = per_tenant
        self._chain_work = ThreadPoolExecutor(chain_workers, thread_name_prefix="audit-chain")
        self._lock = threading.Lock()
        self._tenant_work: Counter[str] = Counter()  # whole-chain jobs queued or running

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        call = _in_context(fn, *args)
        with _refusals_are_400():
            run = asyncio.get_running_loop().run_in_executor(None, call)
            return await within_db_timeout(
                run, self.timeout_s, LedgerUnavailable, "the ledger database"
            )

    async def unbounded(self, tenant: str, receive: Receive, fn: Callable[..., T], *args: Any) -> T:
        """Whole-chain work: ``fn(*args, should_stop=...)``, at most chain_workers at once
        (more wait their turn) and ``per_tenant`` of one tenant's running or waiting (one
        more is a 429: a tenant cannot queue whole-chain work in front of the others). When
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
            except Exception as exc:  # noqa: BLE001 - the reader raises it, on the loop
                pipe.fail(exc)
            else:
                pipe.finish()

        _, stop = self._start(tenant, write)
        try:
            with _refusals_are_400():
                first = await unless_client_leaves(receive, pipe.read())
        except BaseException:
            stop.set()
            pipe.close()
            raise
        return _rest(first, pipe, stop)

    def _start(
        self, tenant: str, fn: Callable[..., T], *args: Any
    ) -> tuple[Future[T], threading.Event]:
        """``fn(*args, should_stop=...)`` submitted to the whole-chain threads, counted to
        its tenant until it ends, and the event that asks it to stop."""
        with self._lock:
            if self._tenant_work[tenant] >= self.per_tenant:
                raise APIError(
                    429,
                    f"this tenant already has {self.per_tenant} verification or export running"
                    " or waiting; retry when it has finished",
                    code="rate_limit_exceeded",
                )
            self._tenant_work[tenant] += 1
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
            self._tenant_work[tenant] -= 1
            if not self._tenant_work[tenant]:
                del self._tenant_work[tenant]

    def close(self) -> None:
        self._chain_work.shutdown(wait=False, cancel_futures=True)


def _in_context(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Callable[[], T]:
    """``fn`` to run in a thread with the request's context (as asyncio.to_thread does, so
    its log lines name the request)."""
    return functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)


@contextlib.contextmanager
def _refusals_are_400() -> Iterator[None]:
    """What the ledger refuses (a bad seq range) is the request's fault: a 400."""
    try:
        yield
    except (ReceiptFormatError, OutOfRange) as exc:
        raise APIError(400, str(exc), code="invalid_value") from None


def _window(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    """The time bounds as datetimes; one that is no real time (month 13, an offset of 73 h)
    or a window whose end is before its start is a 400 naming it, not an empty answer."""
    bounds = []
    for name, value in (("since", since), ("until", until)):
        try:
            bounds.append(queries.parse_time(value) if value is not None else None)
        except ReceiptFormatError as exc:
            raise APIError(400, f"{name}: {exc}", code="invalid_value", param=name) from None
    start, end = bounds
    if start is not None and end is not None and start > end:
        raise APIError(400, "since must not be after until", code="invalid_value", param="since")
    return start, end


def _found(value: T | None, what: str) -> T:
    if value is None:
        raise APIError(404, f"{what} not found in this tenant's chain", code="not_found")
    return value


class AuditController(Controller):
    path = "/audit"
    tags = ["audit"]
    guards = [require_role("auditor", strict_query=True)]
    security = BEARER

    @get(
        "/receipts",
        summary="List receipts (filters, cursor pagination by seq)",
        description=(
            "A page holds at most `limit` receipts and ends early after the receipt that takes"
            f" it past {queries.PAGE_BYTES // 2**20} MiB; pass `next_cursor` as `cursor` for the"
            " next page (null: the last)."
            " `call_id`: the receipt that issued that tool call; `answering`: receipts whose"
            " request carried a tool result for it."
        ),
        responses=documented(),
    )
    async def list_receipts(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        since: Timestamp = None,
        until: Timestamp = None,
        tool_name: Annotated[str | None, shaped(PRINTABLE)] = None,
        model: Annotated[str | None, shaped(PRINTABLE)] = None,
        schema_hash: Annotated[str | None, shaped(SHA256_HEX)] = None,
        call_id: Annotated[str | None, shaped(CALL_ID)] = None,
        answering: Annotated[str | None, shaped(CALL_ID)] = None,
        cursor: int | None = Parameter(
            default=None,
            ge=0,
            le=MAX_SAFE_INT,
            description="next_cursor of a page",
            schema_extra={"minimum": 0},  # Litestar leaves a bound of 0 out of the document
        ),
        limit: int = Parameter(default=100, ge=1, le=1000),
    ) -> ReceiptPage:
        start, end = _window(since, until)
        page = await read(
            ledger.query,
            ReceiptQuery(
                tenant=principal.tenant,
                since=start,
                until=end,
                tool_name=tool_name,
                model=model,
                schema_hash=schema_hash,
                call_id=call_id,
                answering=answering,
                after_seq=cursor,
                limit=limit,
            ),
        )
        return ReceiptPage(page.items, page.next_cursor)

    @get("/receipts/{receipt_id:str}", summary="One receipt", responses=documented())
    async def get_receipt(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        receipt_id: Annotated[str, shaped(RECEIPT_ID)],
    ) -> Receipt:
        receipt = await read(ledger.get, principal.tenant, receipt_id)
        return _found(receipt, f"receipt {receipt_id}")

    @get(
        "/calls/{call_id:str}",
        summary="A tool call, its receipt and the receipts answering it",
        description=(
            f"`answered_by` holds the first {queries.ANSWERS} receipts whose request carried a"
            f" tool result for this call (fewer when they pass {queries.PAGE_BYTES // 2**20} MiB);"
            " `answered_by_next_cursor` continues them through"
            " `GET /audit/receipts?answering=<call_id>&cursor=<it>`."
        ),
        responses=documented(),
    )
    async def get_call(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        call_id: Annotated[str, shaped(CALL_ID)],
    ) -> CallRecord:
        issuer = _found(await read(ledger.find_call, principal.tenant, call_id), f"call {call_id}")
        answers = await read(ledger.answers_to, principal.tenant, call_id)
        return CallRecord(call_id, issuer, answers.items, answers.next_cursor)

    @get(
        "/schemas/{schema_hash:str}",
        summary="A schema by its hash (bound by this chain)",
        responses=documented(),
    )
    async def get_schema(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        schema_hash: Annotated[str, shaped(SHA256_HEX)],
    ) -> dict[str, Any]:
        bound = await read(
            ledger.query, ReceiptQuery(tenant=principal.tenant, schema_hash=schema_hash, limit=1)
        )
        what = f"schema {schema_hash}"
        _found(bound.items or None, what)
        return _found(await read(ledger.schema, schema_hash), what)

    @get(
        "/keys",
        summary="Public keys that signed this chain, with their seq ranges",
        responses=documented(),
    )
    async def public_keys(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
    ) -> list[PublicKeyEntry]:
        if await read(ledger.last_seq, principal.tenant) == 0 and ledger.signer is not None:
            # No key has signed this chain yet: the one that will, with no range, so an
            # auditor can pin it before the first receipt.
            signer = ledger.signer
            return [
                PublicKeyEntry(
                    key_id=signer.key_id, public_key_pem=signer.public_key_pem(), ranges=[]
                )
            ]
        return await read(ledger.public_keys, principal.tenant)

    @get(
        "/checkpoints/latest",
        summary="The latest signed checkpoint of this chain",
        responses=documented(),
    )
    async def latest_checkpoint(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
    ) -> Checkpoint:
        checkpoint = await read(ledger.latest_checkpoint, principal.tenant)
        return _found(checkpoint, "checkpoint")

    @post(
        "/checkpoints",
        status_code=200,
        summary="Sign a checkpoint at the chain's head now",
        responses=documented(),
    )
    async def checkpoint_now(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
    ) -> Checkpoint:
        return await read(ledger.checkpoint_now, principal.tenant)

    @get(
        "/proofs/inclusion/{seq:int}",
        summary="Merkle inclusion proof of a receipt (RFC 9162)",
        responses=documented(),
    )
    async def inclusion_proof(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        seq: Annotated[int, Parameter(ge=1, le=MAX_SAFE_INT)],
        tree_size: int | None = Parameter(default=None, ge=1, le=MAX_SAFE_INT),
    ) -> InclusionProof:
        return await read(ledger.inclusion_proof, principal.tenant, seq, tree_size)

    @get(
        "/proofs/consistency",
        summary="Merkle consistency proof between two tree sizes",
        responses=documented(),
    )
    async def consistency_proof(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        first: int = Parameter(ge=1, le=MAX_SAFE_INT),
        second: int = Parameter(ge=1, le=MAX_SAFE_INT),
    ) -> ConsistencyProof:
        return await read(ledger.consistency_proof, principal.tenant, first, second)

    @post(
        "/verify",
        status_code=200,
        summary="Verify a seq range of this chain",
        responses=documented(*BODY_ERRORS, 429),
        operation_class=OptionalBodyOperation,
        dto=StrictBody[VerifyRequest],
        return_dto=None,
    )
    async def verify(
        self,
        request: Request[Any, Any, Any],
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        data: JSONBody[VerifyRequest | None] = None,
    ) -> VerificationReport:
        data = data or VerifyRequest()
        head = await read(ledger.last_seq, principal.tenant)
        if head == 0:
            return VerificationReport(ok=True, checked=0, chain=principal.tenant)
        for name in ("from_seq", "to_seq"):  # a range must lie inside the chain
            seq = getattr(data, name)
            if seq is not None and seq > head:
                raise APIError(
                    400,
                    f"{name} {seq} is beyond this chain's head (seq {head})",
                    code="invalid_value",
                    param=name,
                )
        if data.from_seq and data.to_seq and data.from_seq > data.to_seq:
            raise APIError(
                400, "from_seq must not be after to_seq", code="invalid_value", param="from_seq"
            )
        saved = [data.checkpoint] if data.checkpoint is not None else []
        return await read.unbounded(
            principal.tenant,
            request.receive,
            functools.partial(ledger.verify, saved=saved),
            principal.tenant,
            data.from_seq,
            data.to_seq,
        )

    @post(
        "/replay/{receipt_id:str}",
        status_code=200,
        summary="Re-run a receipt's request",
        responses=documented(409, *BODY_ERRORS, 422),
        operation_class=OptionalBodyOperation,
        dto=StrictBody[ReplayRequest],
        return_dto=None,
    )
    async def replay_receipt(
        self,
        request: Request[Any, Any, Any],
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        completions: NamedDependency[Completions],
        receipt_id: Annotated[str, shaped(RECEIPT_ID)],
        data: JSONBody[ReplayRequest | None] = None,
    ) -> ReplayReport:
        receipt = _found(
            await read(ledger.get, principal.tenant, receipt_id), f"receipt {receipt_id}"
        )
        check = await read(ledger.verify, principal.tenant, receipt.seq, receipt.seq)
        if not check.ok:  # replaying what its signature does not vouch for proves nothing
            raise ChainDamaged(
                f"receipt {receipt_id} (seq {receipt.seq}) does not verify: {check.reason}"
            )
        force = data.force if data is not None else False
        # engine time, as an agent's request: given up when the auditor leaves
        return await unless_client_leaves(
            request.receive, replay(receipt, completions, force=force)
        )

    @get(
        "/export",
        summary="Export this chain as a bundle that `callproof verify` checks offline",
        media_type="application/gzip",
        responses=documented(429),
        operation_class=GzipOperation,
    )
    async def export(
        self,
        request: Request[Any, Any, Any],
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        read: NamedDependency[LedgerRead],
        since: Timestamp = None,
        until: Timestamp = None,
    ) -> Stream:
        start, end = _window(since, until)
        chunks = await read.streamed(
            principal.tenant,
            request.receive,
            functools.partial(ledger.export, principal.tenant, since=start, until=end),
        )
        return Stream(
            chunks,
            media_type="application/gzip",
            headers={
                "Content-Disposition": f'attachment; filename="{principal.tenant}-receipts.tar.gz"'
            },
        )


async def _rest(
    first: bytes | None, pipe: ThreadPipe, stop: threading.Event
) -> AsyncIterator[bytes]:
    """The stream from its first chunk on. A failure now cannot become an error answer (the
    status is sent): it is logged, and raised so that the response ends unfinished rather than
    as a complete download of a truncated file."""
    try:
        chunk = first
        while chunk is not None:
            yield chunk
            chunk = await pipe.read()
    except Exception as exc:  # Stopped too: the writer cut off a client that took nothing
        log.error(
            "stream failed after its first byte",
            extra={"event": "stream_failed", "kind": type(exc).__name__, "detail": str(exc)},
        )
        raise
    finally:
        stop.set()
        pipe.close()
