"""What the gateway writes into a receipt for one chat completion.

Pure functions from (request, plan, engine identity, generation, parsed output) to the parts of
a `ReceiptDraft`. The request is recorded as digests (messages and the other parameters hashed
separately, so an auditor holding the transcript can check either); the payload itself only
when retention is on, because replay needs it and privacy usually forbids it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.schemas import FinishReason
from receipts.canonical import hash_json, sha256_hex
from receipts.manifest import build_manifest, schema_hash
from receipts.record import ReceiptDraft
from runtime.engines.base import EngineIdentity, Generation, Sampling
from runtime.output_parsing import ParsedResponse
from runtime.planning import Plan


def request_record(sent: dict[str, Any], *, retain_payload: bool) -> dict[str, Any]:
    """Digests of the request exactly as the client sent it (`sent`: its JSON body decoded
    as it is, with no defaults filled in and unknown nested members kept).

    Raises CanonicalizationError when the body holds a number RFC 8785 cannot hash exactly.
    """
    params = {k: v for k, v in sent.items() if k != "messages"}
    record: dict[str, Any] = {
        "messages_sha256": hash_json(sent["messages"]),
        "params_sha256": hash_json(params),
    }
    if retain_payload:
        # JSON text, not objects: a receipt is canonical JSON, which sorts object members, and
        # the order of a schema's properties is part of the prompt that replay sends again.
        record["payload_json"] = {
            "messages": _json_text(sent["messages"]),
            "params": _json_text(params),
        }
    return record


def with_caller(record: dict[str, Any], api_key_id: str, request_id: str | None) -> dict[str, Any]:
    """The request record naming who asked: the API key (its id, never its secret) and the
    HTTP request whose `x-request-id` the gateway's log lines carry."""
    caller = {"api_key_id": api_key_id}
    if request_id is not None:
        caller["request_id"] = request_id
    return {**record, **caller}


def _json_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def manifest_for(
    plan: Plan, identity: EngineIdentity, sampling: Sampling, backend: str
) -> dict[str, Any]:
    """The manifest binds what produced the output: schema, model, weights, backend, sampling."""
    constraint = plan.constraint
    text_constraint = constraint is not None and not constraint.is_json
    return build_manifest(
        schema_hash=schema_hash(plan.schema) if plan.schema is not None else None,
        model=identity.model,
        weights_digest=identity.weights_digest,
        tokenizer_digest=identity.tokenizer_digest,
        engine=identity.engine,
        backend=backend,
        renderer=plan.renderer,
        sampling=sampling.as_manifest(),
        constraint_kind=plan.mode if constraint is not None else "none",
        constraint_sha256=sha256_hex(constraint.source.encode()) if text_constraint else None,
    )


def output_record(parsed: ParsedResponse) -> dict[str, Any]:
    content = parsed.content  # exactly the message.content the client receives
    return {
        "kind": parsed.kind,
        "tool_calls": [
            {"id": call.id, "name": call.name, "arguments": call.arguments}
            for call in parsed.tool_calls
        ],
        "content_sha256": sha256_hex(content.encode()) if content is not None else None,
    }


def finish_reason(parsed: ParsedResponse, generation: Generation) -> FinishReason:
    return "tool_calls" if parsed.tool_calls else generation.finish_reason


def validation_of(parsed: ParsedResponse, generation: Generation) -> dict[str, Any]:
    """The receipt's verdict: only outputs that hold their constraint are returned, except
    text cut off before it was complete, which claims no conformance."""
    if parsed.complete:
        return {"valid": True, "errors": []}
    by = (
        "the token limit"
        if generation.matched_stop is None
        else f"the stop string {generation.matched_stop!r}"
    )
    return {"valid": False, "errors": [f"cut off by {by} before the constraint was satisfied"]}


def draft_for(
    *,
    tenant: str,
    plan: Plan,
    manifest: dict[str, Any],
    request: dict[str, Any],
    generation: Generation,
    parsed: ParsedResponse,
    links: list[dict[str, str | None]],
) -> ReceiptDraft:
    return ReceiptDraft(
        tenant=tenant,
        manifest=manifest,
        schema=plan.schema,
        request=request,
        output=output_record(parsed),
        finish_reason=finish_reason(parsed, generation),
        usage={
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
        },
        validation=validation_of(parsed, generation),
        fallback=generation.fallback,
        links=links,
    )
