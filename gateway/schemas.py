"""Request and response bodies of the HTTP API as msgspec Structs.

The OpenAPI schema Litestar serves is generated from these, so they are the single written
form of the wire format. The chat request forbids unknown fields: a parameter the gateway does
not implement is a 400 naming it, never silently ignored. The exceptions are said where they
are: `user`, `safety_identifier` and the prompt cache hints are accepted and not used, and a
message's members beyond those listed are ignored (clients send back whole response messages).
Wire shapes follow OpenAI's API.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from gateway.shapes import PRINTABLE, TENANT
from receipts.canonical import MAX_SAFE_INT
from receipts.record import Receipt
from runtime.exact_json import MAX_EXACT_INTEGER

# --- errors ---------------------------------------------------------------------------------


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None
    code: str | None
    # structured_output_invalid (422) only: the schema, what the model wrote, where it failed
    schema: dict[str, Any] | None = None
    raw_output: str | None = None
    pointer: str | None = None
    # manifest_mismatch (409, replay) only: the manifest fields the current engine differs in
    differences: list[str] | None = None


class ErrorBody(Struct):
    """OpenAI's error shape; structured_output_invalid adds schema, raw_output and pointer."""

    error: ErrorDetail


# --- chat completion request --------------------------------------------------------------


class ContentPart(Struct, omit_defaults=True):
    type: str
    text: str | None = None
    refusal: str | None = None  # an assistant's refusal part: what that turn said


class FunctionCall(Struct):
    name: str
    arguments: str


class MessageToolCall(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class Message(Struct, omit_defaults=True):
    """One message. Members not listed are ignored: clients append the response's message
    object, with members such as `annotations`, to the next request."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None  # an assistant turn that refused: its text
    function_call: dict[str, Any] | None = None  # legacy function calling: null only
    audio: dict[str, Any] | None = None  # null only


class FunctionDef(Struct, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Struct):
    function: FunctionDef
    type: Literal["function"] = "function"


class NamedFunction(Struct):
    name: str


class NamedToolChoice(Struct, tag_field="type", tag="function"):
    function: NamedFunction


class AllowedTools(Struct, forbid_unknown_fields=True):
    """The only tools the model may call; `mode` as tool_choice's "auto" or "required"."""

    mode: Literal["auto", "required"]
    tools: Annotated[list[NamedToolChoice], Meta(min_length=1)]


class AllowedToolsChoice(Struct, tag_field="type", tag="allowed_tools"):
    allowed_tools: AllowedTools


class TextFormat(Struct, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(Struct, tag_field="type", tag="json_object"):
    pass


class JsonSchemaSpec(Struct, omit_defaults=True):
    name: str
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class JsonSchemaFormat(Struct, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaSpec


class StreamOptions(Struct, forbid_unknown_fields=True, omit_defaults=True):
    include_usage: bool = False
    # OpenAI pads chunks with random `obfuscation` text against length side channels; the
    # gateway never does, so only false (or null) is accepted
    include_obfuscation: Annotated[
        bool | None, Meta(description="only false or null: chunks are never padded")
    ] = None


class PromptCacheOptions(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """OpenAI's prompt caching hints (the SDK's `prompt_cache_options`): accepted, not used."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: str | None = None


PositiveInt = Annotated[int, Meta(ge=1)]


StopString = Annotated[str, Meta(min_length=1, max_length=256)]
# An OpenAI parameter the gateway does not implement, accepted as null (what an SDK wrapper
# sends for an unset argument); gateway.bodies words any other value as unsupported
NullOnly = Annotated[None, Meta(description="not supported: only null is accepted")]
# OpenAI parameters the gateway does not implement, accepted (and null) only at the value
# that means "off", since OpenAI clients send them by default; any other value is a 400
# naming the parameter (OFF_VALUES, below). The document says so (`const`, gateway.openapi).
_UNSUPPORTED = "not supported: only {} (or null) is accepted"
ZeroOnly = Annotated[
    float, Meta(description=_UNSUPPORTED.format(0), extra_json_schema={"const": 0})
]
ZeroIntOnly = Annotated[
    int, Meta(description=_UNSUPPORTED.format(0), extra_json_schema={"const": 0})
]
OneOnly = Annotated[int, Meta(description=_UNSUPPORTED.format(1), extra_json_schema={"const": 1})]
FalseOnly = Annotated[
    bool, Meta(description=_UNSUPPORTED.format("false"), extra_json_schema={"const": False})
]
EmptyOnly = Meta(description=_UNSUPPORTED.format("{}"), extra_json_schema={"maxProperties": 0})


class ChatCompletionRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """POST /v1/chat/completions. `regex` and `grammar` are callproof extensions (extra_body)."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None
    ) = None
    parallel_tool_calls: bool | None = None
    response_format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None = None
    regex: str | None = None
    grammar: str | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None  # 0: the likeliest token alone
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    # the receipt records the seed, and RFC 8785 JSON holds integers exactly up to 2**53 - 1
    seed: Annotated[int, Meta(ge=-MAX_EXACT_INTEGER, le=MAX_EXACT_INTEGER)] | None = None
    # Stop strings are recorded verbatim in the receipt's manifest (replay needs them): each
    # is bounded, so a request cannot make an append-only receipt of megabytes.
    stop: StopString | Annotated[list[StopString], Meta(max_length=4)] | None = None
    n: OneOnly | None = None
    stream: bool | None = None  # null as the SDK sends it: not streamed, as OpenAI takes it
    stream_options: StreamOptions | None = None
    user: str | None = None
    safety_identifier: str | None = None  # who the end user is, as `user`: accepted, not used
    prompt_cache_key: str | None = None  # cache hints: accepted, not used
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    frequency_penalty: ZeroOnly | None = None
    presence_penalty: ZeroOnly | None = None
    logprobs: FalseOnly | None = None
    top_logprobs: ZeroIntOnly | None = None
    logit_bias: Annotated[dict[str, int], EmptyOnly] | None = None
    store: FalseOnly | None = None
    metadata: Annotated[dict[str, str], EmptyOnly] | None = None
    service_tier: NullOnly = None
    reasoning_effort: NullOnly = None
    verbosity: NullOnly = None
    modalities: NullOnly = None
    audio: NullOnly = None
    prediction: NullOnly = None
    web_search_options: NullOnly = None
    functions: NullOnly = None
    function_call: NullOnly = None
    moderation: NullOnly = None


def _off_values(model: type[Struct]) -> dict[str, Any]:
    """Each parameter accepted only at "off", with that value, read from its annotation (a
    `const`, or `maxProperties: 0` for an empty object): the one place that says it."""
    values: dict[str, Any] = {}
    for field in msgspec.inspect.type_info(model).fields:
        members = getattr(field.type, "types", (field.type,))
        for member in members:
            extra = getattr(member, "extra_json_schema", None) or {}
            if "const" in extra:
                values[field.name] = extra["const"]
            elif extra.get("maxProperties") == 0:
                values[field.name] = {}
    return values


OFF_VALUES = _off_values(ChatCompletionRequest)
"""OpenAI parameters the gateway does not implement, accepted at the value that means "off"
(gateway.completion refuses any other, naming it)."""


# --- chat completion response -------------------------------------------------------------


class ReceiptRef(Struct):
    """Where the call's receipt sits in the tenant's chain (also sent as X-Callproof-Receipt)."""

    id: str
    seq: int
    entry_hash: str
    manifest_hash: str


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReason = Literal["stop", "length", "tool_calls"]


class ToolCallOut(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class AssistantMessage(Struct):
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    refusal: None = None
    role: Literal["assistant"] = "assistant"


class Choice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    receipt: ReceiptRef
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class FunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None | UnsetType = UNSET  # null in the first chunk, as OpenAI sends it
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(Struct):
    """One SSE event. As OpenAI's: `usage` is null in every chunk but the usage chunk when
    stream_options.include_usage is set, and absent otherwise; `receipt` is in the last
    chunk only (UNSET fields are left out of the JSON)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    system_fingerprint: str | None = None
    usage: Usage | None | UnsetType = UNSET
    receipt: ReceiptRef | UnsetType = UNSET


# --- models ---------------------------------------------------------------------------------


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str
    object: Literal["model"] = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


# --- audit and admin ------------------------------------------------------------------------


class ReceiptPage(Struct):
    """At most `limit` receipts, fewer when they pass the page's byte bound (the page ends
    after the receipt that passes it); `next_cursor` (null on the last page) continues after
    the last one."""

    items: list[Receipt]
    next_cursor: int | None


class CallRecord(Struct):
    """A tool call, the receipt that issued it and the receipts whose requests answered it:
    the first of those, as many as one answer holds. When there are more,
    `answered_by_next_cursor` is the cursor of `GET /audit/receipts?answering=<call_id>`
    that lists the rest (null: `answered_by` holds them all)."""

    call_id: str
    receipt: Receipt
    answered_by: list[Receipt]
    answered_by_next_cursor: int | None


Seq = Annotated[int, Meta(ge=1, le=MAX_SAFE_INT)]  # exact in every JSON reader


class VerifyRequest(Struct, forbid_unknown_fields=True):
    from_seq: Seq | None = None
    to_seq: Seq | None = None
    # A signed checkpoint the auditor kept (GET /audit/checkpoints/latest, earlier): the
    # stored receipts must still reach its root, so a chain rewritten or cut back since fails.
    checkpoint: dict[str, Any] | None = None


class ReplayRequest(Struct, forbid_unknown_fields=True):
    force: bool = False


class ReplayReport(Struct):
    receipt_id: str
    match: bool
    forced: bool
    differences: Annotated[
        list[str],
        Meta(
            description="manifest fields (model, digests, engine, backend, renderer) in which"
            " the current engine differs from the recorded one: the reasons a replay needed"
            " force"
        ),
    ]
    recorded: dict[str, Any]  # kind, tool_calls, content_sha256, finish_reason
    # the same fields, the grammar backend that ran and the replayed text ("content"), or
    # {"error": ...} when no valid output came
    replayed: dict[str, Any]
    diff: Annotated[
        list[str],
        Meta(
            description="where the replayed output differs from the recorded output; empty"
            " when they match"
        ),
    ]


class Readiness(Struct):
    status: Literal["ready", "not ready"]
    engine: bool
    database: bool


class KeyCreate(Struct, forbid_unknown_fields=True):
    role: Literal["agent", "auditor", "admin"]
    tenant: Annotated[str, Meta(pattern=TENANT.pattern, description=TENANT.words)]
    name: Annotated[str, Meta(pattern=PRINTABLE.pattern, description=PRINTABLE.words)] | None = None


class KeyInfo(Struct):
    id: str
    name: str
    role: str
    tenant: str
    created_at: str
    revoked_at: str | None


class CreatedKey(Struct):
    key: KeyInfo
    secret: str  # shown once; only its SHA-256 is stored


def to_plain(value: Struct) -> Any:
    """Builtins without the unset optional fields (what the runtime and the digests see)."""
    return msgspec.to_builtins(value)
