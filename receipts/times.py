"""Times as receipts hold them: the fixed-width RFC 3339 UTC timestamp a receipt or
checkpoint is stamped with (text that sorts as time, so SQL compares it), and the RFC 3339
times with an offset that an audit query or export is bounded by, read into that form.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

from receipts.errors import ReceiptFormatError

# RFC 3339 UTC with microseconds: ASCII digits ([0-9]; \d also takes other scripts' digits)
# and every field in range; is_timestamp also refuses a day its month lacks (30 February).
TIMESTAMP = re.compile(
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z"
)

RFC3339_TIME = (
    r"^\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)$(?!\n)"
)
"""A time bound as RFC 3339 writes it, with its offset (also an ECMA pattern, for OpenAPI).
A time without one, a Unix time or a space for the T would be guessed at: an auditor in
another time zone would get another window than they meant, and no word of it. RFC 3339
section 5.6 allows "t" and "z" in lower case."""
TIME_WORDS = "an RFC 3339 time with its offset, such as 2026-11-22T16:00:00Z"
_RFC3339_TIME = re.compile(RFC3339_TIME, re.ASCII)  # \d as ECMA reads it
_MICROSECOND = timedelta(microseconds=1)


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds and a "Z" suffix, e.g. 2026-11-21T23:15:00.123456Z."""
    if moment.tzinfo is None:
        raise ReceiptFormatError("timestamps must be timezone-aware (UTC)")
    moment = moment.astimezone(UTC)  # the year padded (strftime's %Y is not), so text sorts
    return f"{moment.year:04d}{moment:-%m-%dT%H:%M:%S.%f}Z"  # as time: SQL compares it so


def utc_now() -> str:
    return format_timestamp(datetime.now(UTC))


def is_timestamp(value: object) -> bool:
    """Whether `value` is a timestamp of this format naming a real moment."""
    if not isinstance(value, str) or not TIMESTAMP.fullmatch(value):
        return False
    try:  # the pattern bounds every field but the day (and year 0): the date alone is left
        date.fromisoformat(value[:10])  # (strptime of the whole: 35x the time, every parse)
    except ValueError:  # a day its month lacks, or year 0
        return False
    return True


def parse_time(text: str) -> datetime:
    """An RFC 3339 time with its offset, in UTC; anything else is ReceiptFormatError.

    Receipts are stamped to the microsecond, so a bound written finer is the next
    microsecond: `since` (included) and `until` (excluded) then select exactly what the
    finer time would."""
    found = _RFC3339_TIME.match(text)
    if not found:
        raise ReceiptFormatError(f"{text!r} is not {TIME_WORDS}")
    digits = (found.group(1) or ".")[1:]
    try:
        offset = found.group(2).upper()  # fromisoformat takes only "T" and "Z"
        moment = datetime.fromisoformat(f"{text[:10]}T{text[11:19]}.{digits[:6]:0<6}{offset}")
        moment = moment.astimezone(UTC)
        return moment + _MICROSECOND if digits[6:].strip("0") else moment
    except ValueError as exc:  # month 13, February 30, second 60
        raise ReceiptFormatError(f"{text!r} is not a valid time: {exc}") from None
    except OverflowError:  # 9999-12-31T23:59:59-23:59 is in year 10000 in UTC
        raise ReceiptFormatError(f"{text!r} is outside years 1-9999 in UTC") from None


def rfc3339(value: datetime | str) -> str:
    """The fixed-width UTC form receipts store (``...T..:..:..ffffffZ``), so that a text
    comparison in SQL is a time comparison. A string must be RFC 3339 with its offset
    (parse_time); a naive datetime is taken as UTC."""
    if isinstance(value, str):
        value = parse_time(value)
    return format_timestamp(value if value.tzinfo else value.replace(tzinfo=UTC))
