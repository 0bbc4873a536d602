"""Typed errors of the receipts package.

Callers branch on the type: the gateway maps `LedgerUnavailable` to a 503 (fail closed: no tool
call leaves without its receipt), bad caller input is a `ReceiptFormatError` (also a
`ValueError`), and a failed check of recorded evidence is a `VerificationError`.
"""

from __future__ import annotations


class ReceiptsError(Exception):
    """Base class of every error raised by receipts/."""


class ReceiptFormatError(ReceiptsError, ValueError):
    """A draft, receipt, checkpoint, proof or bundle is malformed (wrong field, type or shape)."""


class CanonicalizationError(ReceiptFormatError):
    """A value has no RFC 8785 form (NaN, infinity, an integer beyond 2**53, a non-JSON type)."""


class SigningKeyError(ReceiptsError):
    """A signing or public key cannot be loaded (bad PEM, not Ed25519, unreadable file)."""


class KeyAlreadyListed(SigningKeyError):
    """The ledger lists signing keys already: a generated key would be a second identity."""

    def __init__(self, key_ids: list[str]):
        super().__init__(f"the ledger already lists the signing keys {', '.join(key_ids)}")
        self.key_ids = key_ids


class OutOfRange(ReceiptsError):
    """A request names seqs, tree sizes or times the chain does not have (an empty chain
    included): the caller's to fix, not damage and not a malformed receipt."""


class ReadOnlyLedger(ReceiptsError):
    """A ledger opened without a signer (audit reads, verification, export of what stored
    checkpoints cover) was asked to append or sign: open it with the signing key."""


class LedgerUnavailable(ReceiptsError):
    """The ledger cannot commit or answer right now; the caller must fail closed."""


class ChainBehind(LedgerUnavailable):
    """A chain's head is below receipts it already had: a checkpoint stored in the database,
    or a head this ledger saw committed (a database restored from a backup, a standby that
    lagged promoted). Extending or signing it would give those seqs a second history under
    the same key, so both are refused until an operator looks."""


class ChainDamaged(ReceiptsError):
    """The stored chain lacks what an answer is built from (a receipt, a Merkle subtree): not
    the caller's fault, and not transient; verifying the chain names where it is damaged."""


class VerificationError(ReceiptsError):
    """Recorded evidence does not verify. `seq` names the first failing receipt when known."""

    def __init__(self, reason: str, seq: int | None = None) -> None:
        super().__init__(reason if seq is None else f"seq {seq}: {reason}")
        self.reason = reason
        self.seq = seq


class ProofError(VerificationError):
    """A Merkle inclusion or consistency proof does not verify (RFC 9162 section 2.1)."""


class Stopped(ReceiptsError):
    """Whole-chain work (a verification, an export) stopped because its caller asked it to
    (the client that wanted it has gone): there is no answer, and nothing is wrong."""


class BundleTooLarge(ReceiptsError):
    """An export would write a bundle past the bounds every reader holds a bundle to (too
    many distinct schemas, or too many bytes of them): the caller asks for a shorter range."""


class VerifierInputError(ReceiptsError):
    """A verifier's own input is unusable, so there is nothing to verify (exit 2): no file at
    the bundle's path, pinned keys that hold no public key, a file that is not even gzip.
    What is wrong inside a bundle (not a tar.gz, an unsafe member) is a failed report."""


class OverwritesLedger(ReceiptsError):
    """An output path names the SQLite ledger's own file (or its -wal or -shm): writing it
    would replace the database gateways have open under them (exit 2, nothing written)."""


class NotALedgerFile(ReceiptsError):
    """The path a SQLite ledger URL names holds something that is no SQLite database (a
    damaged or foreign file): bad input an operator fixes (exit 2), not an outage to retry."""
