"""Every failure leaves in OpenAI's error shape: {"error": {message, type, param, code}}.

Typed errors from runtime/ and receipts/ already carry what the client needs (status, code,
param); this module only translates them, so an OpenAI SDK raises the matching exception
class (BadRequestError, AuthenticationError, ...) with a precise message.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.openapi.datastructures import ResponseSpec

from gateway.apikeys import KeyStoreUnavailable
from gateway.schemas import ErrorBody
from gateway.shapes import in_words
from receipts.errors import ChainBehind, ChainDamaged, LedgerUnavailable
from runtime.errors import (
    EngineConfigError,
    EngineError,
    EngineFault,
    EngineUnavailable,
    RuntimeInputError,
    StructuredOutputInvalid,
)

log = logging.getLogger("callproof.gateway")

_CLIENT_LEFT = "client disconnected prematurely"  # Litestar's words for a body cut short
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",  # as OpenAI types an unknown model
    405: "invalid_request_error",
    408: "invalid_request_error",  # the client did not send its body in time
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",  # (audit) the tenant's whole-chain work is already under way
    499: "invalid_request_error",  # the client left: its request, not the server, ended it
    503: "service_unavailable_error",
}


BODY_ERRORS = (408, 413)  # what a route that reads a body adds: too slow, too large


def documented(*extra: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error statuses an authenticated route can answer with; a
    route that reads a body adds BODY_ERRORS."""
    statuses = sorted({400, 401, 403, 404, 500, 503, *extra})
    return {
        status: ResponseSpec(
            data_container=ErrorBody, description=HTTPStatus(status).phrase, generate_examples=False
        )
        for status in statuses
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


def model_not_served(requested: str, served: str) -> APIError:
    return APIError(
        404,
        f"model {requested!r} is not served here; GET /v1/models lists {served!r}",
        code="model_not_found",
        param="model",
    )


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


def error_for(exc: Exception) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI-shaped body for any exception (used by SSE streams too)."""
    if isinstance(exc, APIError):
        return exc.status, error_body(
            exc.status, exc.message, code=exc.code, param=exc.param, **exc.details
        )
    for mapped in (_runtime_error, _database_error, _framework_error):
        found = mapped(exc)
        if found is not None:
            return found
    log.error("unhandled error", exc_info=exc, extra={"event": "internal_error"})
    return 500, error_body(500, "internal server error", code="internal_error", param=None)


def _runtime_error(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """The request's fault (4xx) or the model engine's (5xx, logged for the operator)."""
    if isinstance(exc, StructuredOutputInvalid):
        return exc.status, error_body(
            exc.status,
            exc.message,
            code=exc.code,
            param=exc.param,
            schema=exc.schema,
            raw_output=exc.raw_output,
            pointer=exc.pointer,
        )
    if isinstance(exc, RuntimeInputError):
        return exc.status, error_body(exc.status, exc.message, code=exc.code, param=exc.param)
    if not isinstance(exc, EngineError):
        return None
    if isinstance(exc, EngineFault):  # a bug: the operator needs where, to report it
        log.error("engine fault", exc_info=exc, extra={"event": "engine_fault"})
    elif isinstance(exc, EngineUnavailable):  # the operator's URL, timeout or server
        log.warning(
            "engine unavailable",
            extra={"event": "engine_error", "code": exc.code, "detail": str(exc)},
        )
    else:  # the engine's words about a request may quote it: not logged
        log.warning("engine failure", extra={"event": "engine_error", "code": exc.code})
    return exc.status, error_body(exc.status, f"model engine: {exc}", code=exc.code, param=None)


def _database_error(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """The ledger or the key store cannot answer (503: fail closed) or is damaged (500)."""
    if isinstance(exc, ChainBehind):  # no passing outage: an operator must act
        log.error("chain behind", extra={"event": "chain_behind", "detail": str(exc)})
        message = f"the receipt ledger refuses this tenant's chain: {exc}"
        return 503, error_body(503, message, code="ledger_unavailable", param=None)
    if isinstance(exc, LedgerUnavailable | KeyStoreUnavailable):
        # Fail closed: nothing leaves without its committed receipt.
        log.warning(
            "database unavailable",
            extra={"event": "db_unavailable", "kind": type(exc).__name__, "detail": str(exc)},
        )
        message = (
            "the API key database is unavailable, so the key cannot be checked; retry later"
            if isinstance(exc, KeyStoreUnavailable)
            else "the receipt ledger's database is unavailable; retry later (no tool call is"
            " returned without its committed receipt)"
        )
        return 503, error_body(503, message, code="ledger_unavailable", param=None)
    if isinstance(exc, ChainDamaged):
        log.error("chain damaged", extra={"event": "chain_damaged", "detail": str(exc)})
        return 500, error_body(
            500,
            f"the ledger is damaged: {exc}; POST /audit/verify names the first bad receipt",
            code="chain_damaged",
            param=None,
        )
    return None


def _framework_error(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """What Litestar raised: a parameter that failed validation, a route or method that does
    not exist, a body too large or a client gone."""
    if isinstance(exc, ValidationException):
        return 400, _validation_body(exc)
    if isinstance(exc, HTTPException) and exc.detail == _CLIENT_LEFT:
        # Nobody reads this answer; 499 (nginx's "client closed request") keeps the gateway's
        # own 500 count for its own faults.
        return 499, error_body(
            499, "the client disconnected before sending the whole body", code=None, param=None
        )
    if isinstance(exc, HTTPException):
        return exc.status_code, _http_body(exc)
    return None


RETRY_AFTER_S = "1"  # a 503 is a passing outage; the OpenAI SDK honours Retry-After
# A 503 no retry can heal (a chain an operator must look at, the engine's settings): the
# OpenAI SDK obeys `x-should-retry: false` instead of sending the request twice more.
_LASTING = (ChainBehind, EngineConfigError)


def handle_exception(_: Request, exc: Exception) -> Response[dict[str, Any]]:
    return error_response(exc)


def json_not_found(response: Response[Any]) -> Response[Any]:
    """Turn Litestar's HTML page for an unknown /schema/* path into the API's JSON 404."""
    return error_response(NotFoundException()) if response.status_code == 404 else response


def error_response(exc: Exception) -> Response[dict[str, Any]]:
    """The OpenAI-shaped error response for ``exc``, with the headers its status calls for."""
    status, body = error_for(exc)
    # Litestar's own headers go along, such as a 405's Allow (RFC 9110 section 15.5.6)
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    if status == 503:
        lasting = isinstance(exc, _LASTING)
        headers.update({"x-should-retry": "false"} if lasting else {"Retry-After": RETRY_AFTER_S})
    return Response(body, status_code=status, media_type=MediaType.JSON, headers=headers)


def _validation_body(exc: ValidationException) -> dict[str, Any]:
    """Litestar's parameter validation (query, path, header; JSON bodies are gateway.bodies'):
    name the offending parameter like OpenAI does."""
    for item in exc.extra or []:
        if isinstance(item, dict) and item.get("source") == "body":
            return error_body(
                400,
                "the request body is empty; send a JSON object",
                code="invalid_json",
                param=None,
            )
        if isinstance(item, dict):
            key = item.get("key")
            message = in_words(str(item.get("message", exc.detail)), key)
            return error_body(400, f"invalid request: {message}", code="invalid_value", param=key)
    return error_body(400, f"invalid request: {exc.detail}", code="invalid_value", param=None)


def _http_body(exc: HTTPException) -> dict[str, Any]:
    status = exc.status_code
    defaults = {
        401: "missing or invalid API key (send Authorization: Bearer cp_...)",
        404: "no such route",
        413: "request body too large",
    }
    codes = {
        401: "invalid_api_key",
        404: "not_found",
        405: "method_not_allowed",
        413: "body_too_large",
    }
    generic = exc.detail in (None, "", HTTPStatus(status).phrase)
    message = defaults.get(status, exc.detail) if generic else exc.detail
    return error_body(status, message, code=codes.get(status), param=None)
