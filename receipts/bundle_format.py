"""The export bundle's format: a .tar.gz that proves a run of one chain's receipts with
nothing but the file itself (and, ideally, the operator's public key).

Layout (docs/receipt-format.md has the precise rules):

    bundle-manifest.json   format, version, chain, seq range, SHA-256 of every other file
    checkpoint.json        a signed checkpoint whose tree covers the last receipt
    proofs.json            first seq, previous entry hash, compact ranges left and right
    keys.json              key ids with the seq ranges they signed; keys/<id>.pem the keys
    schemas/<hash>.json    every bound schema, canonical JSON, named by its SHA-256
    receipts.jsonl         one receipt per line (canonical JSON), in seq order

A bundle is hostile input until verified, so a reader holds it to the bounds below
(receipts.bundle_archive); the writer (receipts.bundle_writer) refuses, before writing a
byte, a bundle that would not fit them, so that none it writes is refused for its size.
receipts.bundle_verify verifies one. Nothing here reads or writes a file.
"""

from __future__ import annotations

import re

BUNDLE_FORMAT = "callproof-bundle"
BUNDLE_VERSION = 1
MANIFEST = "bundle-manifest.json"
RECEIPTS = "receipts.jsonl"
SMALL_FILES = ("checkpoint.json", "proofs.json", "keys.json")
MEMBER = re.compile(  # every name a member may have
    r"(bundle-manifest|checkpoint|proofs|keys)\.json|receipts\.jsonl"
    r"|keys/ed25519_[0-9a-f]{32}\.pem|schemas/[0-9a-f]{64}\.json"
)
DIRECTORIES = frozenset({"", ".", "keys", "schemas"})

MAX_SMALL_FILE = 64 << 20  # metadata, schemas and receipt lines are small: refuse a bomb
MAX_SMALL_TOTAL = 256 << 20  # every member but receipts.jsonl together, tar headers included
MAX_MEMBERS = 100_000  # a few files and one schema per distinct tool set
MAX_RECEIPTS_BYTES = 64 << 30  # receipts.jsonl, whatever number of receipts is announced
# A bound on the values and keys in one JSON file or receipt line, as the count of its `[`,
# `{`, `,` and `:` bytes (value_count_problem: the format's rule is that count, below this).
# Parsed, a value takes up to about 70 bytes of memory, 25 times its text for `[{},{},...]`:
# the byte bounds alone let a 200 KB bundle take 3.4 GB to verify. A receipt reaches this
# only with a retained request body of 2 MB or more.
MAX_JSON_VALUES = 2_000_000


def value_count_problem(text: bytes) -> str | None:
    """Why the JSON ``text`` may hold more than MAX_JSON_VALUES values and keys, or None; told
    without parsing it: each one but the first follows a ``[``, ``{``, ``,`` or ``:`` byte,
    so their count bounds it (those in strings count too), and a shorter text is under it."""
    if len(text) < MAX_JSON_VALUES:
        return None
    if sum(map(text.count, (b"[", b"{", b",", b":"))) < MAX_JSON_VALUES:
        return None
    return f"may hold {MAX_JSON_VALUES:,} JSON values or more (counted as its [ {{ , : bytes)"


def key_file(key_id: str) -> str:
    """keys/ed25519_<hex>.pem: the key id with ":" spelled "_" so the name extracts anywhere."""
    return "keys/" + key_id.replace(":", "_") + ".pem"


def announced(manifest: object, field: str) -> int | None:
    """An integer the bundle manifest announces; true is not 1 here, whatever Python says."""
    value = manifest.get(field) if isinstance(manifest, dict) else None
    return value if type(value) is int else None
