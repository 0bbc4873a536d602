"""Replay of a receipt: re-run its recorded request with its recorded sampling and seed.

Only meaningful on the engine that produced it, so a replay is refused (409) when the current
model, weights or tokenizer digest, engine, grammar backend or prompt renderer differ from the
manifest, unless forced. It needs the request itself, which exists only when payload retention
was on when it was recorded.
Tool call ids are minted afresh on every run, so outputs are compared without them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from gateway.apikeys import ApiKey
from gateway.completion import Completions
from gateway.errors import APIError
from gateway.recording import finish_reason, output_record
from gateway.schemas import ChatCompletionRequest, ReplayReport
from receipts.manifest import schema_hash
from receipts.record import Receipt
from runtime.engines.base import NO_BACKEND, EngineIdentity, Sampling
from runtime.errors import RuntimeInputError, StructuredOutputInvalid

log = logging.getLogger("callproof.gateway")


class ReplayTurns:
    """Replays take the engine from the agents, so they take turns: one runs at a time and
    the others wait; and a tenant has at most one running or waiting (another is a 429), so
    one tenant's auditor cannot queue replays in front of every other tenant's."""

    def __init__(self) -> None:
        self._turn = asyncio.Semaphore(1)
        self._tenants: set[str] = set()  # with a replay running or waiting (the loop's alone)

    @asynccontextmanager
    async def take(self, tenant: str) -> AsyncIterator[None]:
        if tenant in self._tenants:
            raise APIError(
                429,
                "this tenant already has a replay running or waiting; retry when it has finished",
                code="rate_limit_exceeded",
            )
        self._tenants.add(tenant)
        try:
            async with self._turn:
                yield
        finally:
            self._tenants.discard(tenant)


def manifest_differences(
    manifest: dict[str, Any], identity: EngineIdentity, renderer: str
) -> list[str]:
    """Human-readable differences between the recorded manifest and the current engine and
    the prompt ``renderer`` it would use now: anything that changes which tokens the same
    request yields."""
    current = {
        "model": identity.model,
        "weights_digest": identity.weights_digest,
        "tokenizer_digest": identity.tokenizer_digest,
        "engine": identity.engine,
        "renderer": renderer,
    }
    differences = [
        f"{name}: recorded {manifest[name]!r}, current {value!r}"
        for name, value in current.items()
        if manifest[name] != value
    ]
    if manifest["backend"] not in (NO_BACKEND, *identity.backends):  # free text: any replays
        differences.append(
            f"backend: recorded {manifest['backend']!r}, current {' then '.join(identity.backends)}"
        )
    return differences


def recorded_request(receipt: Receipt, served_model: str) -> ChatCompletionRequest:
    texts = receipt.request.get("payload_json")
    if texts is None:
        raise APIError(
            409,
            f"receipt {receipt.id} holds only digests of its request (payload retention was "
            "off when it was recorded), so there is nothing to replay",
            code="payload_not_retained",
        )
    # Decoded in the client's member order, which is part of the prompt.
    values = {part: msgspec.json.decode(text) for part, text in texts.items()}
    body = {**values["params"], "messages": values["messages"]}
    body.update(model=served_model, stream=False)
    body.pop("stream_options", None)
    try:
        return msgspec.convert(body, ChatCompletionRequest)
    except msgspec.ValidationError as exc:  # recorded by a release that read requests so
        raise not_replayable(receipt, str(exc)) from None


def not_replayable(receipt: Receipt, why: str) -> APIError:
    """A recorded request this gateway would refuse now: read otherwise by an older release,
    or past a limit lowered since (max_tools, schema size); the auditor's request is fine."""
    return APIError(
        409,
        f"receipt {receipt.id}'s recorded request is not one this gateway accepts ({why}),"
        " so it cannot be run again here; its receipt still verifies",
        code="request_not_replayable",
    )


def recorded_sampling(manifest: dict[str, Any]) -> Sampling:
    sampling = dict(manifest["sampling"])
    sampling["stop"] = tuple(sampling.get("stop") or ())
    return Sampling(**sampling)


def _comparable(output: dict[str, Any], finish: str) -> dict[str, Any]:
    calls = [{"name": c["name"], "arguments": c["arguments"]} for c in output["tool_calls"]]
    return {
        "kind": output["kind"],
        "tool_calls": calls,
        "content_sha256": output["content_sha256"],
        "finish_reason": finish,
    }


async def replay(
    receipt: Receipt,
    completions: Completions,
    turns: ReplayTurns,
    auditor: ApiKey,
    *,
    force: bool,
) -> ReplayReport:
    """The receipt's request run again, on the grammar backend it names when this engine has
    it (else the first that compiles, a difference only force lets through)."""
    identity = completions.engine.identity
    request = recorded_request(receipt, identity.model)
    try:
        prepared = completions.prepare(request, sampling=recorded_sampling(receipt.manifest))
    except RuntimeInputError as exc:
        raise not_replayable(receipt, exc.message) from None
    differences = manifest_differences(receipt.manifest, identity, prepared.plan.renderer)
    if differences and not force:
        raise APIError(
            409,
            "the current engine differs from the receipt's manifest ("
            + "; ".join(differences)
            + "); send force=true to replay anyway",
            code="manifest_mismatch",
            details={"differences": differences},
        )
    recorded = _comparable(receipt.output, receipt.finish_reason)
    backend = receipt.manifest["backend"]
    pinned = backend if backend in identity.backends else None
    try:
        async with turns.take(receipt.tenant):
            generation, parsed = await completions.generate(prepared, backend=pinned)
    except StructuredOutputInvalid as exc:
        # The recorded output was returned to its agent; a replay that returns none is a
        # mismatch to report, not a fault in the auditor's request.
        replayed: dict[str, Any] = {"error": exc.message}
        diff = [f"output: recorded a {recorded['kind']!r} output, replayed none: {exc}"]
    else:
        replayed = _comparable(output_record(parsed), finish_reason(parsed, generation))
        diff = [
            f"{field}: recorded {recorded[field]!r}, replayed {replayed[field]!r}"
            for field in recorded
            if recorded[field] != replayed[field]
        ]
        replayed["backend"] = generation.backend
        if parsed.content is not None:  # the receipt holds its hash; the auditor, the text
            replayed["content"] = parsed.content
        if pinned is not None and generation.backend != pinned:  # it no longer compiles
            diff.append(f"backend: recorded {pinned!r}, replayed {generation.backend!r}")
    bound = receipt.manifest["schema_hash"]
    current = schema_hash(prepared.plan.schema) if prepared.plan.schema is not None else None
    if bound != current:
        diff.append(f"schema_hash: recorded {bound!r}, replayed {current!r}")
    log.info(  # nothing is receipted for a replay: this line is its trail
        "receipt replayed",
        extra={
            "event": "receipt_replayed",
            "receipt_id": receipt.id,
            "chain": receipt.tenant,
            "api_key_id": auditor.id,
            "match": not diff,
            "forced": force,
        },
    )
    return ReplayReport(
        receipt_id=receipt.id,
        match=not diff,
        forced=force,
        differences=differences,
        recorded=recorded,
        replayed=replayed,
        diff=diff,
    )
