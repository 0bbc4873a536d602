"""The shapes of the identifiers, names and times a request may carry, each with its words.

A value is checked by its pattern before anything reads it: a malformed receipt id is a 400,
not a lookup. msgspec checks the patterns (for Litestar's query and path parameters, and
for JSON bodies) and reports a mismatch as "Expected `str` matching regex '<pattern>'",
which is right but makes a client read a regex; `in_words` says the shape's words instead.
(`(?!\\n)`: Python's `$` also matches before a final newline; the lookahead shuts that out
and is still an ECMA pattern for the OpenAPI document.)
"""

from __future__ import annotations

from dataclasses import dataclass

from receipts import record, times
from runtime.messages import ANSWERED_CALL_ID


@dataclass(frozen=True)
class Shape:
    pattern: str
    words: str  # what a value of this shape is, for a 400 and the OpenAPI description


RECEIPT_ID = Shape(rf"^{record.RECEIPT_ID.pattern}$(?!\n)", "rcpt_ and 24 lowercase hex digits")
CALL_ID = Shape(rf"^{record.CALL_ID.pattern}$(?!\n)", "call_ and 24 lowercase hex digits")
# A tool result may answer a call the gateway did not issue (another provider's, in a history
# an agent carried over): its receipt records that id, unlinked, and an auditor looks it up.
ANSWERED_ID = Shape(
    rf"^{ANSWERED_CALL_ID.pattern}$(?!\n)",
    "1-64 printable ASCII characters, as a tool message's tool_call_id",
)
API_KEY_ID = Shape(r"^key_[0-9a-f]{16}$(?!\n)", "key_ and 16 lowercase hex digits")
SHA256_HEX = Shape(r"^[0-9a-f]{64}$(?!\n)", "a SHA-256 hash: 64 lowercase hex digits")
# A tenant names a receipt chain, a database value and an export file name: kept plain.
TENANT = Shape(
    r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$(?!\n)",
    "1-128 letters, digits, '.', '_', '@' or '-', starting with a letter or digit",
)
# A key's name, or a tool or model name to filter receipts by: no control characters (C0,
# C1), nor the line separators and bidirectional overrides that would garble `keys list`.
PRINTABLE = Shape(
    r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]{1,200}$(?!\n)",
    "1-200 printable characters",
)
TIME = Shape(times.RFC3339_TIME, times.TIME_WORDS)


_MISMATCH = {
    f"Expected `str` matching regex {shape.pattern!r}": shape
    for shape in (RECEIPT_ID, CALL_ID, ANSWERED_ID, API_KEY_ID, SHA256_HEX, TENANT, PRINTABLE, TIME)
}


def in_words(message: str, param: str | None) -> str:
    """msgspec's `message` about `param`, with a known shape's words for its pattern."""
    shape = _MISMATCH.get(message.partition(" - at `")[0])
    if shape is None:
        return message
    return f"{param or 'the value'} must be {shape.words}"
