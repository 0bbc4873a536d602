"""POST /v1/chat/completions: the OpenAI-compatible endpoint agents call."""

from __future__ import annotations

import secrets
import time

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from gateway.apikeys import ApiKey
from gateway.auth import BEARER, require_role
from gateway.bodies import StrictBody, decode_as_sent
from gateway.completion import Completions, receipt_ref, usage_of
from gateway.disconnect import unless_client_leaves
from gateway.errors import BODY_ERRORS, documented
from gateway.openapi import ChatOperation
from gateway.recording import finish_reason
from gateway.schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    FunctionCall,
    ToolCallOut,
)
from gateway.sse import ChunkWriter, stream_completion

RECEIPT_HEADER = "X-Callproof-Receipt"


class ChatController(Controller):
    path = "/v1/chat/completions"
    tags = ["chat"]
    guards = [require_role("agent")]
    security = BEARER

    @post(
        "",
        status_code=200,
        summary="Create a chat completion (receipted)",
        description=(
            "OpenAI-compatible. The response (or, when streaming, the last SSE chunk) carries "
            "`receipt`, and non-streaming responses the `X-Callproof-Receipt` header; the "
            "receipt is committed before any tool call leaves. With `stream: true` the body is "
            "`text/event-stream` of chat.completion.chunk objects ending in `data: [DONE]`."
        ),
        responses=documented(*BODY_ERRORS, 422),
        operation_class=ChatOperation,
        dto=StrictBody[ChatCompletionRequest],
        return_dto=None,
    )
    async def create(
        self,
        request: Request,
        data: JSONBody[ChatCompletionRequest],
        principal: NamedDependency[ApiKey],
        completions: NamedDependency[Completions],
    ) -> Response[ChatCompletion]:
        model = completions.engine.identity.model
        prepared = completions.prepare(data, sent=decode_as_sent(await request.body()))
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        if prepared.stream:
            # Queued behind other requests, a stream whose client has left is dropped before
            # the engine reaches it, as a plain request is.
            events = await unless_client_leaves(request.receive, completions.open_stream(prepared))
            writer = ChunkWriter(
                completion_id, created, model, completions.fingerprint, prepared.include_usage
            )
            # Declared as the JSON answer, whose schema OpenAPI shows; ChatOperation adds the
            # stream's, which a union with Stream in the signature would not.
            return Stream(  # type: ignore[return-value]
                stream_completion(completions, prepared, principal, events, writer),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        generation, parsed, receipt = await unless_client_leaves(
            request.receive, completions.answer(prepared, principal)
        )
        calls = [
            ToolCallOut(call.id, FunctionCall(call.name, call.arguments_json()))
            for call in parsed.tool_calls
        ]
        body = ChatCompletion(
            id=completion_id,
            created=created,
            model=model,
            choices=[
                Choice(
                    index=0,
                    message=AssistantMessage(content=parsed.content, tool_calls=calls or None),
                    finish_reason=finish_reason(parsed, generation),
                )
            ],
            usage=usage_of(generation),
            receipt=receipt_ref(receipt),
            system_fingerprint=completions.fingerprint,
        )
        return Response(body, headers={RECEIPT_HEADER: receipt.id})
