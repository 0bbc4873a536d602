"""Which keys a verifier trusts: the keys it pins or, unpinned, the keys the evidence
carries; and the note a report gives saying on what authority it passed."""

from __future__ import annotations

import json
import re
from typing import Any

from receipts.errors import ReceiptsError, VerificationError, VerifierInputError
from receipts.signing import KeyRing


def pinned_keys(pinned: str | bytes) -> KeyRing:
    """The keys a verifier pins: PEM public keys (one or more blocks; no ranges, so each key
    is trusted for every seq) or the JSON list `GET /audit/keys` returns, each key with the
    seq ranges it signed, which are then enforced: a retired key cannot sign past its range."""
    text = pinned.decode("utf-8", errors="replace") if isinstance(pinned, bytes) else pinned
    if text.lstrip().startswith("["):
        try:
            return KeyRing.from_public_keys(json.loads(text))
        except (ValueError, ReceiptsError) as exc:
            raise VerifierInputError(
                f"the pinned keys are not the JSON of GET /audit/keys: {exc}"
            ) from None
    blocks = re.findall(r"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", text, re.DOTALL)
    if not blocks:
        raise VerifierInputError(
            "the pinned keys hold no PEM public key (nor the JSON list of GET /audit/keys)"
        )
    ring = KeyRing()
    for block in blocks:
        ring.add_pem(block)
    return ring


def trusted_keys(
    bundle_keys: list[dict[str, Any]], pinned: str | bytes | None
) -> tuple[KeyRing, str]:
    """The key ring a bundle's verifier trusts and a note saying on what authority.

    Unpinned, the bundle's own keys and ranges are trusted: that proves the bundle is intact
    and self-consistent, not who made it. Pinned, only the pinned keys are trusted, with the
    pinned ranges if any: the bundle's keys.json is not signed, so its ranges prove nothing.
    Either way the bundle's keys must be well formed, each PEM matching its key id: a bundle
    that passes for its pinning auditor verifies for whoever it is handed on to."""
    ring = None if pinned is None else pinned_keys(pinned)  # the caller's input fails first
    try:
        bundle_ring = KeyRing.from_public_keys(bundle_keys)
    except ReceiptsError as exc:
        raise VerificationError(f"bundle keys: {exc}") from exc
    if ring is None:
        return bundle_ring, (  # named, so an auditor can compare them with the operator's
            f"trusted the bundle's own keys ({', '.join(bundle_ring.key_ids())}): this proves"
            " integrity, not origin; pin the operator's keys with --public-key"
        )
    return ring, pinned_note(ring)


def pinned_note(keyring: KeyRing) -> str:
    """The note of a verification that trusted only pinned keys, of a bundle or a database:
    whether they were held to seq ranges, which a PEM file cannot give."""
    note = f"trusted only the pinned key(s): {', '.join(keyring.key_ids())}"
    unranged = keyring.unranged()
    if not unranged:
        return note + ", each within its pinned seq ranges"
    return note + (
        f"; a PEM file pins no seq ranges, so {', '.join(unranged)} is trusted for every seq"
        " (pin the JSON of GET /audit/keys to hold retired keys to their ranges)"
    )
