"""URLs fit for a log line or a message: the password a URL may carry (``http://user:secret@
host``, the vLLM server's or the ledger database's) is a credential, never shown."""

from __future__ import annotations

import re

# The user-info's password: after the first ':' of the authority, up to its last '@' (a
# password may hold a raw '@'; the authority ends at '/', '?' or '#').
_PASSWORD = re.compile(r"(://[^/?#@]*?:)[^/?#]*@")
# libpq also reads a password from the query string (`?password=...`), in any case.
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def hide_password(url: str) -> str:
    """``url`` with its password shown as ``***``, as SQLAlchemy shows a database URL's,
    whether in its user-info or its query; any text that is no URL with a password (a bad
    value being reported) comes back unchanged."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***@", url, count=1))
