"""The processors inside transformers' generate() on the real SmolLM2, and the post-hoc path."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from grammar_testkit import compiled, smol_tokenizer

from runtime.constrained import ConstrainedLogitsProcessor, post_hoc_retry_json, processor_of
from runtime.constraint import Constraint
from runtime.errors import StructuredOutputInvalid

pytestmark = pytest.mark.model

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "celsius": {"type": "integer", "minimum": -50, "maximum": 60},
        "sky": {"enum": ["sunny", "cloudy", "rain"]},
    },
    "required": ["city", "celsius", "sky"],
    "additionalProperties": False,
}
PROMPTS = ["What is the weather in Paris?", "Tell me a joke about cats."]


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from runtime.model_store import bundled_model_dir

    return AutoModelForCausalLM.from_pretrained(bundled_model_dir(), dtype=torch.float32).eval()


def generate(model, prompt: str, processor=None, max_new_tokens: int = 40) -> str:
    tok = smol_tokenizer()
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        logits_processor=[processor] if processor else None,
        pad_token_id=tok.eos_token_id,
    )
    return tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def processor(constraint: Constraint) -> ConstrainedLogitsProcessor:
    return processor_of(compiled(constraint), smol_tokenizer())


@pytest.mark.parametrize("prompt", PROMPTS)
def test_json_schema_processor_in_generate(model, prompt):
    constraint = Constraint.json_schema(WEATHER)
    assert compiled(constraint).backend == "llguidance"
    jsonschema.validate(json.loads(generate(model, prompt, processor(constraint))), WEATHER)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_regex_processor_in_generate(model, prompt):
    pattern = r"(Yes|No), because [a-z ]{3,40}\."
    text = generate(model, prompt, processor(Constraint.regex(pattern)))
    assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("prompt", PROMPTS[:1])
def test_cfg_processor_in_generate(model, prompt):
    grammar = (
        'start: "It is " TEMP " degrees and " SKY "."\nTEMP: /-?[0-9]{1,2}/\n'
        'SKY: "sunny" | "cloudy"'
    )
    text = generate(model, prompt, processor(Constraint.ebnf(grammar)))
    assert re.fullmatch(r"It is -?[0-9]{1,2} degrees and (sunny|cloudy)\.", text), text


def test_post_hoc_retry_folds_the_pointer_into_the_reprompt():
    outputs = iter(
        [
            'Sure! {"city": "Paris", "celsius": 99, "sky": "sunny"}',
            '```json\n{"city": "Paris", "celsius": 21, "sky": "sunny"}\n```',
        ]
    )
    prompts = []

    def generate_fn(prompt: str) -> str:
        prompts.append(prompt)
        return next(outputs)

    parsed = post_hoc_retry_json(
        generate_fn, "weather in Paris?", WEATHER, 2, param="response_format"
    )
    assert parsed["celsius"] == 21
    assert "/celsius" in prompts[1] and "99 is greater than the maximum of 60" in prompts[1]


def test_post_hoc_retry_treats_a_number_no_receipt_can_hold_as_a_reason_to_retry():
    """The final parse would refuse it (a 422 with no retry left): so the loop refuses it."""
    outputs = iter(['{"n": 9007199254740993}', '{"n": 12}'])
    prompts = []

    def generate_fn(prompt: str) -> str:
        prompts.append(prompt)
        return next(outputs)

    parsed = post_hoc_retry_json(
        generate_fn, "a number?", {"type": "object"}, 1, param="response_format"
    )
    assert parsed == {"n": 12}
    assert "outside +-(2**53 - 1)" in prompts[1]


def test_post_hoc_retry_on_the_real_model_returns_a_typed_verdict(model):
    try:
        parsed = post_hoc_retry_json(
            lambda p: generate(model, p, max_new_tokens=24),
            "Weather in Paris as JSON.",
            WEATHER,
            0,
            param="response_format",
        )
    except StructuredOutputInvalid as err:
        assert err.status == 422
        assert err.param == "response_format"
        assert (
            err.raw_output
            and err.schema == WEATHER
            and err.message.startswith(("output fails its schema", "the output is not JSON"))
        )
    else:  # SmolLM2 rarely manages; when it does the value must validate
        jsonschema.validate(parsed, WEATHER)
