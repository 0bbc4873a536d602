"""system_fingerprint: OpenAI's word for "what produced this output", from the engine's
identity, so that a client comparing seeded answers sees when it changed."""

from __future__ import annotations

import dataclasses

from gateway.completion import system_fingerprint
from runtime.engines.base import EngineIdentity

IDENTITY = EngineIdentity("m", "a" * 64, "b" * 64, "embedded", ("llguidance", "xgrammar"))


def test_the_fingerprint_is_stable_and_changes_with_each_fact_it_covers() -> None:
    assert system_fingerprint(IDENTITY) == system_fingerprint(dataclasses.replace(IDENTITY))
    changed = [
        dataclasses.replace(IDENTITY, model="m2"),
        dataclasses.replace(IDENTITY, weights_digest="c" * 64),
        dataclasses.replace(IDENTITY, tokenizer_digest=None),
        dataclasses.replace(IDENTITY, engine="vllm"),
        dataclasses.replace(IDENTITY, backends=("xgrammar", "llguidance")),
    ]
    prints = {system_fingerprint(identity) for identity in [IDENTITY, *changed]}
    assert len(prints) == len(changed) + 1
