"""Structured JSON logs. Only metadata is ever logged: never message payloads, never keys."""

from __future__ import annotations

import json
import logging
import secrets
import sys
import time
from contextvars import ContextVar

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The id of the HTTP request being served (also its `x-request-id` response header), so
every line logged while serving it names it. The timing middleware (gateway.metrics) sets it,
and writes the access line, since both wrap the same whole request."""


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class RequestIdFilter(logging.Filter):
    """Stamps each record with the id of the request being served when it is logged (a
    handler's filter runs in the logging call's context), so the formatter has it as a field."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = request_id.get()
        if current is not None and not hasattr(record, "request_id"):
            record.request_id = current
        return True


def configure_logging(level: str) -> None:
    """One JSON line per event on stderr, for the gateway and uvicorn alike."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # the gateway logs its own access lines
