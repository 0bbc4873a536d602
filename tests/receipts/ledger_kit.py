"""Helpers for the ledger-store tests: migrated databases, drafts that go through the real
append path, and raw SQL access for the tamper tests (what an attacker with the database
credentials can do: bypass the append-only triggers and rewrite rows)."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from migrations.runner import upgrade
from receipts.canonical import hash_json
from receipts.ledger import Ledger, ReceiptQuery
from receipts.manifest import build_manifest, schema_hash
from receipts.record import Receipt, ReceiptDraft
from receipts.signing import Signer

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
SEARCH_PARAMS = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"],
}


def tool_union(**tools: dict[str, Any]) -> dict[str, Any]:
    """A tool union in the shape runtime.union_schema.union_schema builds (what binding.py reads)."""
    branches = [
        {
            "type": "object",
            "properties": {"tool": {"const": name}, "arguments": params},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
        for name, params in tools.items()
    ]
    branches.append(
        {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
            "additionalProperties": False,
        }
    )
    return {"anyOf": branches}


UNION = tool_union(get_weather=WEATHER_PARAMS, search=SEARCH_PARAMS)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def draft(
    tenant: str = "acme",
    *,
    tool: str = "get_weather",
    arguments: dict[str, Any] | None = None,
    call: str | None = None,
    links: list[dict[str, Any]] | None = None,
    model: str = "SmolLM2-135M-Instruct",
    schema: dict[str, Any] = UNION,
    payload: Any = None,
) -> ReceiptDraft:
    """A tool-call draft as the gateway would build it."""
    manifest = build_manifest(
        schema_hash=schema_hash(schema),
        model=model,
        weights_digest=digest("weights"),
        tokenizer_digest=digest("tokenizer"),
        engine="embedded",
        backend="llguidance",
        renderer="generic",
        sampling={"temperature": 0.0, "seed": 7, "max_tokens": 128},
        constraint_kind="tools",
    )
    request = {"messages_sha256": digest(secrets.token_hex(8)), "params_sha256": digest("p")}
    if payload is not None:  # {"messages": [...], "params": {...}}, as retention keeps them
        request = {f"{part}_sha256": hash_json(value) for part, value in payload.items()}
        request["payload_json"] = {part: json.dumps(value) for part, value in payload.items()}
    return ReceiptDraft(
        tenant=tenant,
        manifest=manifest,
        schema=schema,
        request=request,
        output={
            "kind": "tool_calls",
            "content_sha256": None,
            "tool_calls": [
                {
                    "id": call or call_id(),
                    "name": tool,
                    "arguments": arguments
                    if arguments is not None
                    else {"city": "Paris", "days": 2},
                }
            ],
        },
        finish_reason="tool_calls",
        usage={"prompt_tokens": 120, "completion_tokens": 18},
        validation={"valid": True, "errors": []},
        fallback=None,
        links=links or [],
    )


def append_worker(
    url: str, signer_pem: bytes, count: int, report: Any, tenant: str = "acme", window: int = 64
) -> None:
    """A writer process (spawned): append ``count`` drafts with ``window`` in flight and send
    (receipt id, seq) through ``report`` (a Connection) as each append returns."""
    from collections import deque

    led = Ledger(url, Signer.from_pem(signer_pem))
    in_flight: deque[Any] = deque()
    for i in range(count):
        if len(in_flight) >= window:
            receipt = in_flight.popleft().result()
            report.send((receipt.id, receipt.seq))
        in_flight.append(led.submit(draft(tenant)))
    for future in in_flight:
        receipt = future.result()
        report.send((receipt.id, receipt.seq))
    led.close()
    report.send(None)


def migrated(url: str) -> str:
    upgrade(url)
    return url


@contextmanager
def ledger(url: str, signer: Signer | None = None, **options: Any) -> Iterator[Ledger]:
    led = Ledger(url, signer or Signer.generate(), **options)
    try:
        yield led
    finally:
        led.close()


def at_seq(led: Ledger, tenant: str, seq: int) -> Receipt:
    """The chain's receipt at ``seq`` (through the audit listing, as an auditor finds it)."""
    (receipt,) = led.query(ReceiptQuery(tenant, after_seq=seq - 1, limit=1)).items
    assert receipt.seq == seq
    return receipt


def fill(led: Ledger, n: int, tenant: str = "acme") -> list:
    """n receipts appended concurrently (so they group-commit), returned in seq order."""
    futures = [led.submit(draft(tenant)) for _ in range(n)]
    return sorted((f.result() for f in futures), key=lambda r: r.seq)


@contextmanager
def attacker(url: str) -> Iterator[sa.Connection]:
    """A connection that can rewrite the append-only tables (triggers bypassed)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET session_replication_role = replica")
            else:
                names = (
                    conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'")
                    .scalars()
                    .all()
                )
                for name in names:
                    conn.exec_driver_sql(f'DROP TRIGGER "{name}"')
            yield conn
    finally:
        engine.dispose()


TERMINATE_BACKENDS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{db}'"
)
COUNT_BACKENDS = "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}'"


def on_server(url: str, sql: str) -> Any:
    """Run ``sql`` (``{db}``: the database of the Postgres ``url``) from the server's
    ``postgres`` database, outside a transaction: how the outage tests cut a ledger off.
    Returns the first column of the first row, if the statement returns rows."""
    server, db = url.rsplit("/", 1)
    admin = sa.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            result = conn.exec_driver_sql(sql.format(db=db))
            return result.scalar() if result.returns_rows else None
    finally:
        admin.dispose()


def clone(url: str, name: str, template: str | None = None) -> str:
    """A copy of the (idle) database at ``url`` (or of Postgres' ``template``, e.g. the empty
    template1) named ``name``: tests tamper with copies of one chain."""
    if url.startswith("sqlite"):
        source = Path(url.split("///", 1)[1])
        target = source.with_name(name + ".db")
        shutil.copyfile(source, target)
        return f"sqlite:///{target}"
    server, source_db = url.rsplit("/", 1)
    template = template or source_db
    admin = sa.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        admin.dispose()
    return f"{server}/{name}"


def body_of(conn: sa.Connection, tenant: str, seq: int) -> dict[str, Any]:
    text = conn.execute(
        sa.text("SELECT body FROM receipts WHERE chain = :c AND seq = :s"), {"c": tenant, "s": seq}
    ).scalar_one()
    return json.loads(text)
