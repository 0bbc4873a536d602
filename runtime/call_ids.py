"""Tool call ids: ``call_`` and 24 lowercase hex, minted once per call of a request.

The id is what a later ``tool`` message names (``tool_call_id``) and what the ledger links
that answer by, so it must not change when the same output is parsed again (a post-hoc retry,
the stream decoder, then the final parse): :class:`CallIds` hands out one id per call index.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

CALL_ID_RE = re.compile(r"call_[0-9a-f]{24}")  # fullmatch: `$` would let a final \n in


def new_call_id() -> str:
    """``call_`` + 24 lowercase hex from the OS CSPRNG (96 bits: collisions are not a concern)."""
    return "call_" + secrets.token_hex(12)


@dataclass
class CallIds:
    """Ids by call index, minted on first use and then stable.

    One instance lives as long as one request: a post-hoc retry, the stream decoder and the
    final parse all ask it for call ``i`` and get the same id, so an id is minted once per
    call no matter how many times its text is parsed.
    """

    _ids: list[str] = field(default_factory=list)

    def for_index(self, index: int) -> str:
        while len(self._ids) <= index:
            self._ids.append(new_call_id())
        return self._ids[index]


__all__ = ["CALL_ID_RE", "CallIds", "new_call_id"]
