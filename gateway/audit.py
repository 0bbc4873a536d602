"""The audit API (auditor keys only), always scoped to the auditor's own tenant chain.

Every handler reads through its `chain` dependency (gateway.ledger_read.TenantChain), which
names the tenant from the key, never from the request, and runs the blocking database reads
off the event loop.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, TypeVar

from litestar import Controller, Request, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody, Parameter
from litestar.response import Stream

from gateway.apikeys import ApiKey
from gateway.auth import BEARER, require_role
from gateway.bodies import StrictBody
from gateway.completion import Completions
from gateway.disconnect import unless_client_leaves
from gateway.errors import BODY_ERRORS, APIError, documented
from gateway.ledger_read import TenantChain
from gateway.openapi import GzipOperation, OptionalBodyOperation
from gateway.query import shaped
from gateway.replay import ReplayTurns, replay
from gateway.schemas import CallRecord, ReceiptPage, ReplayReport, ReplayRequest, VerifyRequest
from gateway.shapes import ANSWERED_ID, CALL_ID, PRINTABLE, RECEIPT_ID, SHA256_HEX, TIME
from receipts import queries
from receipts.canonical import MAX_SAFE_INT  # seqs stay exact in every JSON reader
from receipts.chain import VerificationReport
from receipts.checkpoint import Checkpoint
from receipts.errors import ChainDamaged, ReceiptFormatError
from receipts.ledger_proofs import ConsistencyProof, InclusionProof
from receipts.record import Receipt
from receipts.signing import PublicKeyEntry
from receipts.times import parse_time

T = TypeVar("T")
Timestamp = Annotated[str | None, shaped(TIME)]


def _window(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    """The time bounds as datetimes; one that is no real time (month 13, an offset of 73 h)
    or a window whose end is before its start is a 400 naming it, not an empty answer."""
    bounds = []
    for name, value in (("since", since), ("until", until)):
        try:
            bounds.append(parse_time(value) if value is not None else None)
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
            " request carried a tool result for it (any tool_call_id, the gateway's or not)."
        ),
        responses=documented(),
    )
    async def list_receipts(
        self,
        chain: NamedDependency[TenantChain],
        since: Timestamp = None,
        until: Timestamp = None,
        tool_name: Annotated[str | None, shaped(PRINTABLE)] = None,
        model: Annotated[str | None, shaped(PRINTABLE)] = None,
        schema_hash: Annotated[str | None, shaped(SHA256_HEX)] = None,
        call_id: Annotated[str | None, shaped(CALL_ID)] = None,
        answering: Annotated[str | None, shaped(ANSWERED_ID)] = None,
        cursor: int | None = Parameter(
            default=None,
            ge=0,
            le=MAX_SAFE_INT,
            description="next_cursor of a page",
            schema_extra={"minimum": 0},  # Litestar leaves a bound of 0 out of the document
        ),
        limit: int = Parameter(default=100, ge=1, le=queries.MAX_PAGE),
    ) -> ReceiptPage:
        start, end = _window(since, until)
        page = await chain.query(
            since=start,
            until=end,
            tool_name=tool_name,
            model=model,
            schema_hash=schema_hash,
            call_id=call_id,
            answering=answering,
            after_seq=cursor,
            limit=limit,
        )
        return ReceiptPage(page.items, page.next_cursor)

    @get("/receipts/{receipt_id:str}", summary="One receipt", responses=documented())
    async def get_receipt(
        self,
        chain: NamedDependency[TenantChain],
        receipt_id: Annotated[str, shaped(RECEIPT_ID)],
    ) -> Receipt:
        return _found(await chain.get(receipt_id), f"receipt {receipt_id}")

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
        chain: NamedDependency[TenantChain],
        call_id: Annotated[str, shaped(CALL_ID)],
    ) -> CallRecord:
        issuer = _found(await chain.find_call(call_id), f"call {call_id}")
        answers = await chain.answers_to(call_id)
        return CallRecord(call_id, issuer, answers.items, answers.next_cursor)

    @get(
        "/schemas/{schema_hash:str}",
        summary="A schema by its hash (bound by this chain)",
        responses=documented(),
    )
    async def get_schema(
        self,
        chain: NamedDependency[TenantChain],
        schema_hash: Annotated[str, shaped(SHA256_HEX)],
    ) -> dict[str, Any]:
        return _found(await chain.schema(schema_hash), f"schema {schema_hash}")

    @get(
        "/keys",
        summary="Public keys that signed this chain, with their seq ranges",
        responses=documented(),
    )
    async def public_keys(
        self,
        chain: NamedDependency[TenantChain],
    ) -> list[PublicKeyEntry]:
        return await chain.public_keys()

    @get(
        "/checkpoints/latest",
        summary="The latest signed checkpoint of this chain",
        responses=documented(),
    )
    async def latest_checkpoint(
        self,
        chain: NamedDependency[TenantChain],
    ) -> Checkpoint:
        return _found(await chain.latest_checkpoint(), "checkpoint")

    @post(
        "/checkpoints",
        status_code=200,
        summary="Sign a checkpoint at the chain's head now",
        responses=documented(),
    )
    async def checkpoint_now(
        self,
        chain: NamedDependency[TenantChain],
    ) -> Checkpoint:
        return await chain.checkpoint_now()

    @get(
        "/proofs/inclusion/{seq:int}",
        summary="Merkle inclusion proof of a receipt (RFC 9162)",
        responses=documented(),
    )
    async def inclusion_proof(
        self,
        chain: NamedDependency[TenantChain],
        seq: Annotated[int, Parameter(ge=1, le=MAX_SAFE_INT)],
        tree_size: int | None = Parameter(default=None, ge=1, le=MAX_SAFE_INT),
    ) -> InclusionProof:
        return await chain.inclusion_proof(seq, tree_size)

    @get(
        "/proofs/consistency",
        summary="Merkle consistency proof between two tree sizes",
        responses=documented(),
    )
    async def consistency_proof(
        self,
        chain: NamedDependency[TenantChain],
        first: int = Parameter(ge=1, le=MAX_SAFE_INT),
        second: int = Parameter(ge=1, le=MAX_SAFE_INT),
    ) -> ConsistencyProof:
        return await chain.consistency_proof(first, second)

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
        chain: NamedDependency[TenantChain],
        data: JSONBody[VerifyRequest | None] = None,
    ) -> VerificationReport:
        data = data or VerifyRequest()
        head = await chain.reach()
        for name in ("from_seq", "to_seq"):  # a range must lie inside the chain, empty or not
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
        return await chain.verify(request.receive, data.from_seq, data.to_seq, saved)

    @post(
        "/replay/{receipt_id:str}",
        status_code=200,
        summary="Re-run a receipt's request",
        responses=documented(409, *BODY_ERRORS, 422, 429),
        operation_class=OptionalBodyOperation,
        dto=StrictBody[ReplayRequest],
        return_dto=None,
    )
    async def replay_receipt(
        self,
        request: Request[Any, Any, Any],
        chain: NamedDependency[TenantChain],
        completions: NamedDependency[Completions],
        replays: NamedDependency[ReplayTurns],
        principal: NamedDependency[ApiKey],
        receipt_id: Annotated[str, shaped(RECEIPT_ID)],
        data: JSONBody[ReplayRequest | None] = None,
    ) -> ReplayReport:
        receipt = _found(await chain.get(receipt_id), f"receipt {receipt_id}")
        check = await chain.verify_one(receipt.seq)
        if not check.ok:  # replaying what its signature does not vouch for proves nothing
            raise ChainDamaged(
                f"receipt {receipt_id} (seq {receipt.seq}) does not verify: {check.reason}"
            )
        force = data.force if data is not None else False
        # engine time, as an agent's request: given up when the auditor leaves
        return await unless_client_leaves(
            request.receive, replay(receipt, completions, replays, principal, force=force)
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
        chain: NamedDependency[TenantChain],
        since: Timestamp = None,
        until: Timestamp = None,
    ) -> Stream:
        start, end = _window(since, until)
        chunks = await chain.export(request.receive, start, end)
        return Stream(
            chunks,
            media_type="application/gzip",
            headers={
                "Content-Disposition": f'attachment; filename="{chain.tenant}-receipts.tar.gz"'
            },
        )
