"""Every failure leaves the gateway in OpenAI's error shape: {"error": {message, type, param, code}}.

Typed errors from runtime/ and receipts/ already carry what the client needs (status, code,
param); this module only translates them, so an OpenAI SDK raises the matching exception
class (BadRequestError, AuthenticationError, ...) with a precise message.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException

from gateway.apikeys import KeyStoreUnavailable
from receipts.errors import LedgerUnavailable
from runtime.errors import EngineError, RuntimeInputError, StructuredOutputInvalid

log = logging.getLogger("callproof.gateway")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error the gateway itself decides on (auth, not found, replay refused, ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        details: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.details = details or {}


def error_body(
    status: int, message: str, *, code: str | None, param: str | None, **details: Any
) -> dict[str, Any]:
    error = {
        "message": message,
        "type": _TYPES.get(status, "server_error"),
        "param": param,
        "code": code,
    }
    error.update(details)
    return {"error": error}


def error_response(
    status: int, message: str, *, code: str | None = None, param: str | None = None, **details: Any
) -> Response[dict[str, Any]]:
    return Response(
        error_body(status, message, code=code, param=param, **details),
        status_code=status,
        media_type=MediaType.JSON,
    )


def _api_error(_: Request, exc: APIError) -> Response:
    return error_response(exc.status, exc.message, code=exc.code, param=exc.param, **exc.details)


def _runtime_input(_: Request, exc: RuntimeInputError) -> Response:
    details: dict[str, Any] = {}
    if isinstance(exc, StructuredOutputInvalid):
        details = {"schema": exc.schema, "raw_output": exc.raw_output, "pointer": exc.pointer}
    return error_response(exc.status, exc.message, code=exc.code, param=exc.param, **details)


def _engine(_: Request, exc: EngineError) -> Response:
    log.warning("engine failure", extra={"event": "engine_error", "code": exc.code})
    return error_response(exc.status, f"model engine: {exc}", code=exc.code)


def _unavailable(_: Request, exc: Exception) -> Response:
    """The ledger or key database is down: fail closed, nothing leaves without its receipt."""
    log.warning("database unavailable", extra={"event": "db_unavailable", "kind": type(exc).__name__})
    return error_response(
        503,
        "the receipt ledger is unavailable; no output is returned without a committed receipt",
        code="ledger_unavailable",
    )


def _validation(_: Request, exc: ValidationException) -> Response:
    """msgspec/Litestar body validation: name the offending parameter like OpenAI does."""
    param = None
    message = exc.detail
    for item in exc.extra or []:
        if isinstance(item, dict):
            message = item.get("message", message)
            key = item.get("key")
            param = key if key and key != "body" else param
            break
    param = param or _param_from_message(message)
    code = "unsupported_parameter" if "unknown field" in message else "invalid_value"
    return error_response(400, f"invalid request body: {message}", code=code, param=param)


def _param_from_message(message: str) -> str | None:
    """msgspec says 'Object contains unknown field `n2` - at `$`' or '... - at `$.messages[0]`'."""
    if "unknown field `" in message:
        return message.split("unknown field `", 1)[1].split("`", 1)[0]
    if "at `$." in message:
        return message.split("at `$.", 1)[1].split("`", 1)[0]
    return None


def _http(_: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    messages = {
        401: "missing or invalid API key (send Authorization: Bearer cp_...)",
        404: "no such route",
        413: "request body too large",
    }
    codes = {401: "invalid_api_key", 403: "forbidden", 404: "not_found", 413: "body_too_large"}
    generic = exc.detail in (None, "", HTTPStatus(status).phrase)
    message = messages.get(status, exc.detail) if generic else exc.detail
    return error_response(status, message, code=codes.get(status))


def _internal(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", extra={"event": "internal_error"})
    return error_response(500, "internal server error", code="internal_error")


EXCEPTION_HANDLERS: dict[type[Exception], Any] = {
    APIError: _api_error,
    RuntimeInputError: _runtime_input,
    EngineError: _engine,
    LedgerUnavailable: _unavailable,
    KeyStoreUnavailable: _unavailable,
    ValidationException: _validation,
    HTTPException: _http,
    Exception: _internal,
}
