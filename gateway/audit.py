"""The audit API (auditor keys only), always scoped to the auditor's own tenant chain.

Every read names the tenant from the key, never from the request, so an auditor cannot even
learn whether another tenant's receipt id exists: it is simply "not found". Ledger reads are
blocking database calls and run in a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, TypeVar

from litestar import Controller, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody, Parameter
from litestar.response import Stream

from gateway.apikeys import ApiKey
from gateway.auth import require_role
from gateway.completion import Completions
from gateway.errors import APIError
from gateway.replay import replay
from gateway.schemas import CallRecord, ReceiptPage, ReplayReport, ReplayRequest, VerifyRequest
from gateway.settings import Settings
from receipts.ledger import Ledger, ReceiptQuery
from receipts.record import Receipt
from runtime.limits import Limits

T = TypeVar("T")
_EXPORT_CHUNK = 1 << 16


async def _read(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


def _found(value: T | None, what: str) -> T:
    if value is None:
        raise APIError(404, f"{what} not found in this tenant's chain", code="not_found")
    return value


def _report(report: Any) -> dict[str, Any]:
    return dataclasses.asdict(report) if dataclasses.is_dataclass(report) else dict(report)


class AuditController(Controller):
    path = "/audit"
    tags = ["audit"]
    dependencies = {"principal": Provide(require_role("auditor"))}

    @get("/receipts", summary="List receipts (filters, cursor pagination by seq)")
    async def list_receipts(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        since: FromQuery[datetime | None] = None,
        until: FromQuery[datetime | None] = None,
        tool_name: FromQuery[str | None] = None,
        model: FromQuery[str | None] = None,
        schema_hash: FromQuery[str | None] = None,
        call_id: FromQuery[str | None] = None,
        cursor: int | None = Parameter(default=None, ge=0, description="next_cursor of a page"),
        limit: int = Parameter(default=100, ge=1, le=1000),
    ) -> ReceiptPage:
        page = await _read(
            ledger.query,
            ReceiptQuery(
                tenant=principal.tenant,
                since=since,
                until=until,
                tool_name=tool_name,
                model=model,
                schema_hash=schema_hash,
                call_id=call_id,
                after_seq=cursor,
                limit=limit,
            ),
        )
        return ReceiptPage([r.to_json_obj() for r in page.items], page.next_cursor)

    @get("/receipts/{receipt_id:str}", summary="One receipt")
    async def get_receipt(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        receipt_id: FromPath[str],
    ) -> dict[str, Any]:
        receipt = await _read(ledger.get, principal.tenant, receipt_id)
        return _found(receipt, f"receipt {receipt_id}").to_json_obj()

    @get("/calls/{call_id:str}", summary="A tool call, its receipt and the receipts answering it")
    async def get_call(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        call_id: FromPath[str],
    ) -> CallRecord:
        issuer = _found(await _read(ledger.find_call, principal.tenant, call_id), f"call {call_id}")
        answers: list[Receipt] = await _read(ledger.answers_to, principal.tenant, call_id)
        return CallRecord(call_id, issuer.to_json_obj(), [r.to_json_obj() for r in answers])

    @get("/schemas/{schema_hash:str}", summary="A schema by its hash (bound by this chain)")
    async def get_schema(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        schema_hash: FromPath[str],
    ) -> dict[str, Any]:
        bound = await _read(
            ledger.query, ReceiptQuery(tenant=principal.tenant, schema_hash=schema_hash, limit=1)
        )
        what = f"schema {schema_hash}"
        _found(bound.items or None, what)
        return _found(await _read(ledger.schema, schema_hash), what)

    @get("/keys", summary="Public keys that signed this chain, with their seq ranges")
    async def public_keys(
        self, principal: NamedDependency[ApiKey], ledger: NamedDependency[Ledger]
    ) -> list[dict[str, Any]]:
        return await _read(ledger.public_keys, principal.tenant)

    @get("/checkpoints/latest", summary="The latest signed checkpoint of this chain")
    async def latest_checkpoint(
        self, principal: NamedDependency[ApiKey], ledger: NamedDependency[Ledger]
    ) -> dict[str, Any]:
        checkpoint = await _read(ledger.latest_checkpoint, principal.tenant)
        return _found(checkpoint, "checkpoint")

    @get("/proofs/inclusion/{seq:int}", summary="Merkle inclusion proof of a receipt (RFC 9162)")
    async def inclusion_proof(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        seq: FromPath[int],
        tree_size: int | None = Parameter(default=None, ge=1),
    ) -> dict[str, Any]:
        return await _read(ledger.inclusion_proof, principal.tenant, seq, tree_size)

    @get("/proofs/consistency", summary="Merkle consistency proof between two tree sizes")
    async def consistency_proof(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        first: int = Parameter(ge=1),
        second: int = Parameter(ge=1),
    ) -> dict[str, Any]:
        return await _read(ledger.consistency_proof, principal.tenant, first, second)

    @post("/verify", status_code=200, summary="Verify a seq range of this chain")
    async def verify(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        data: JSONBody[VerifyRequest | None] = None,
    ) -> dict[str, Any]:
        data = data or VerifyRequest()
        report = await _read(ledger.verify, principal.tenant, data.from_seq, data.to_seq)
        return _report(report)

    @post("/replay/{receipt_id:str}", status_code=200, summary="Re-run a receipt's request")
    async def replay_receipt(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        completions: NamedDependency[Completions],
        settings: NamedDependency[Settings],
        limits: NamedDependency[Limits],
        receipt_id: FromPath[str],
        data: JSONBody[ReplayRequest | None] = None,
    ) -> ReplayReport:
        receipt = _found(
            await _read(ledger.get, principal.tenant, receipt_id), f"receipt {receipt_id}"
        )
        force = data.force if data is not None else False
        return await replay(receipt, completions, settings, limits, force=force)

    @get(
        "/export",
        summary="Export this chain as a bundle that `callproof verify` checks offline",
        media_type="application/gzip",
    )
    async def export(
        self,
        principal: NamedDependency[ApiKey],
        ledger: NamedDependency[Ledger],
        since: FromQuery[datetime | None] = None,
        until: FromQuery[datetime | None] = None,
    ) -> Stream:
        fd, path = tempfile.mkstemp(prefix="callproof-export-", suffix=".tar.gz")
        os.close(fd)
        try:
            await _read(ledger.export, principal.tenant, path, since, until)
        except BaseException:
            os.unlink(path)
            raise
        return Stream(
            _file_chunks(path),
            media_type="application/gzip",
            headers={
                "Content-Disposition": f'attachment; filename="{principal.tenant}-receipts.tar.gz"'
            },
        )


async def _file_chunks(path: str) -> AsyncIterator[bytes]:
    """The bundle's bytes, then the temporary file is gone."""
    try:
        with open(path, "rb") as bundle:
            while chunk := await asyncio.to_thread(bundle.read, _EXPORT_CHUNK):
                yield chunk
    finally:
        os.unlink(path)
