"""URLs fit for a log line or a message: the password a URL may carry (``http://user:secret@
host``, the vLLM server's or the ledger database's) is a credential, never shown."""

from __future__ import annotations

import re

# The user-info's password: after the first ':' of the authority, up to its last '@' (a
# password may hold a raw '@'; the authority ends at '/', '?' or '#').
_PASSWORD = re.compile(r"(://[^/?#@]*?:)[^/?#]*@")


def hide_password(url: str) -> str:
    """``url`` with its password shown as ``***``, as SQLAlchemy shows a database URL's; any
    text that is no URL with a password (a bad value being reported) comes back unchanged."""
    return _PASSWORD.sub(r"\1***@", url, count=1)
