"""What a receipt draft holds (gateway/recording.py), checked where the suite's engine never
produces it: its test model compiles every schema, so no gateway test sees a fallback."""

from __future__ import annotations

from gateway.recording import draft_for, manifest_for
from runtime.engines.base import EngineIdentity, Generation, Sampling
from runtime.output_parsing import ParsedResponse
from runtime.planning import ChatInput, plan_chat


def test_a_receipt_draft_keeps_the_engines_fallback() -> None:
    """A JSON output no backend enforced (retried until it validated) is receipted as such,
    not as if a grammar had held it."""
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    plan = plan_chat(
        ChatInput(
            messages=[{"role": "user", "content": "hi"}],
            response_format=schema,
            model="HuggingFaceTB/SmolLM2-135M-Instruct",
        )
    )
    generation = Generation(
        text="{}",
        prompt_tokens=3,
        completion_tokens=2,
        finish_reason="stop",
        backend="none",
        fallback="post_hoc_retry:2",
    )
    identity = EngineIdentity(
        model="m",
        weights_digest=None,
        tokenizer_digest=None,
        engine="embedded",
        backends=("llguidance",),
    )
    draft = draft_for(
        tenant="acme",
        plan=plan,
        manifest=manifest_for(plan, identity, Sampling(seed=1), "none"),
        request={"messages_sha256": "0" * 64, "params_sha256": "0" * 64},
        generation=generation,
        parsed=ParsedResponse(kind="parsed", content="{}", parsed={}),
        links=[],
    )
    assert draft.fallback == "post_hoc_retry:2"
    assert draft.manifest["backend"] == "none"
