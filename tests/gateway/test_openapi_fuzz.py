"""schemathesis against the served OpenAPI document: no input may produce a 5xx, and every
response must match what the document promises (status codes, content types, bodies).

Excluded: schemathesis' positive-data check, because a body the document's types admit can
still be refused on meaning, rightly with a 400: a model this gateway does not serve, a tool
schema that is not valid JSON Schema, a regex that does not compile, conflicting constraints.
(gateway/openapi.py puts the numeric bounds Litestar drops back into the document.)

A second app on the same engine and ledger serves the fuzzing with a 4-token budget, so the
generated requests that are valid still run the real model but finish fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from gateway.app import create_app

pytestmark = pytest.mark.model

EXAMPLES = int(os.environ.get("CALLPROOF_FUZZ_EXAMPLES", "12"))  # per operation; more locally
ROLE_BY_PREFIX = {"/v1/": "agent", "/audit/": "auditor", "/admin/": "admin"}


@pytest.fixture(scope="module")
def fuzz_url(gateway: Any, server_loop: Any) -> Iterator[str]:
    import dataclasses

    tiny = dataclasses.replace(gateway.settings, default_max_tokens=2, max_tokens_limit=4)
    url, stop = server_loop.serve(create_app(tiny, gateway.engine, gateway.ledger, gateway.keys))
    yield url
    stop()


def test_no_server_errors_and_responses_match_the_schema(gateway: Any, fuzz_url: str) -> None:
    schema = schemathesis.openapi.from_url(fuzz_url + "/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:
        role = next((r for p, r in ROLE_BY_PREFIX.items() if operation.path.startswith(p)), None)
        headers = {"Authorization": f"Bearer {gateway.secrets[role]}"} if role else {}

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Any) -> None:
            case.call_and_validate(
                base_url=fuzz_url,
                headers=headers,  # noqa: B023 - fuzz() runs within this iteration
                excluded_checks=[positive_data_acceptance],
            )

        fuzz()
