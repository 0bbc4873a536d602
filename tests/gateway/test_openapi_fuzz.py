"""schemathesis against the served OpenAPI document: no input may produce a 5xx, and every
response must match what the document promises (status codes, content types, bodies).

Excluded: schemathesis' positive-data check, because a body the document's types admit can
still be refused on meaning, rightly with a 400: a model this gateway does not serve, a tool
schema that is not valid JSON Schema, a regex that does not compile, conflicting constraints.
(gateway/openapi.py puts the numeric bounds Litestar drops back into the document.)

A second app on the same engine and ledger serves the fuzzing with a 4-token budget, so the
generated requests that are valid still run the real model but finish fast. Half the cases
are grounded: path parameters, the proof sizes and the chat model are replaced by ones that
exist (a receipt made for the test, its call, schema and seq; for a chat completion only
the served model, a plain message and a 2-token budget), so the
documented 200 bodies are checked too, not only the 4xx of random ids; every operation must
have answered at least one 2xx.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from conftest import served_again
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance
from test_ops import call_tool

pytestmark = pytest.mark.model

EXAMPLES = int(os.environ.get("CALLPROOF_FUZZ_EXAMPLES", "12"))  # per operation; more locally
ROLE_BY_PREFIX = {"/v1/": "agent", "/audit/": "auditor", "/admin/": "admin"}


@pytest.fixture(scope="module")
def fuzz_url(gateway: Any, server_loop: Any) -> Iterator[str]:
    with served_again(gateway, server_loop, default_max_tokens=2, max_tokens_limit=4) as tiny:
        yield tiny.url


def existing_values(gateway: Any) -> dict[str, Any]:
    """Values that name things the ledger and the gateway hold, by parameter name."""
    completion = call_tool(gateway)
    receipt = gateway.ledger.get(gateway.tenant, completion.model_extra["receipt"]["id"])
    return {
        "receipt_id": receipt.id,
        "call_id": receipt.tool_calls[0]["id"],
        "schema_hash": receipt.manifest["schema_hash"],
        "seq": receipt.seq,
        "first": 1,
        "second": receipt.seq,
        "model": gateway.model,
        "key_id": gateway.keys.create("agent", "fuzzed")[0].id,  # DELETE may revoke it
    }


HELLO = {"role": "user", "content": "Say hi."}


def test_no_server_errors_and_responses_match_the_schema(gateway: Any, fuzz_url: str) -> None:
    schema = schemathesis.openapi.from_url(fuzz_url + "/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    existing = existing_values(gateway)

    def grounded(case: Any) -> Any:
        for where in ("path_parameters", "query"):
            values = getattr(case, where)
            if values:
                setattr(case, where, {k: existing.get(k, v) for k, v in values.items()})
        if isinstance(case.body, dict) and "model" in case.body:  # a chat completion
            case.body = {"model": gateway.model, "messages": [HELLO], "max_tokens": 2}
        return case

    statuses: dict[str, set[int]] = defaultdict(set)
    for operation in operations:
        role = next((r for p, r in ROLE_BY_PREFIX.items() if operation.path.startswith(p)), None)
        headers = {"Authorization": f"Bearer {gateway.secrets[role]}"} if role else {}
        strategy = operation.as_strategy()

        @given(case=st.one_of(strategy, strategy.map(grounded)))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,  # the same cases every run: the 2xx check below cannot flake
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Any) -> None:
            response = case.call_and_validate(
                base_url=fuzz_url,
                headers=headers,  # noqa: B023 - fuzz() runs within this iteration
                excluded_checks=[positive_data_acceptance],
            )
            statuses[case.operation.label].add(response.status_code)

        fuzz()
    never_succeeded = sorted(
        label for label, seen in statuses.items() if not any(200 <= s < 300 for s in seen)
    )
    assert never_succeeded == [], {label: statuses[label] for label in never_succeeded}
