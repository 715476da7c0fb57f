"""schemathesis against the gateway (mock backend, in process): every body /openapi.json allows is answered 2xx,
and every answer matches the schema (status codes, content types, JSON bodies and each SSE event).

Positive cases only, a bounded number per operation (a few seconds). A made-up model name may get 404. Two rules JSON Schema cannot state are the
only 400s allowed for schema-valid bodies: min_tokens <= max_tokens, and prompt + max_tokens within the context.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from services.gateway.app import GatewayApp

EXAMPLES = 40
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _cross_field_refusal(response: Any) -> bool:
    """A 400 for one of the two rules the schema can only describe in words."""
    if response.status_code != 400:
        return False
    error = response.json()["error"]
    return error.get("code") == "context_length_exceeded" or (
        error.get("param") == "min_tokens" and "max_tokens" in error["message"])


@pytest.mark.parametrize("path,method", [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                                         ("/v1/models", "GET")])
def test_positive_cases_are_accepted_and_conform(app: GatewayApp, path: str, method: str) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operation = schema[path][method]

    @settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.generate], derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def run(case: schemathesis.Case) -> None:
        response = case.call()
        case.validate_response(response, checks=CHECKS)
        # Like schemathesis' positive_data_acceptance: 404 (a model name it made up) is not a refusal of the body.
        assert response.status_code < 300 or response.status_code == 404 or _cross_field_refusal(response), \
            f"schema-valid body refused: {case.body!r:.300} -> {response.status_code} {response.text[:300]}"

    run()


def test_schema_refuses_what_the_server_refuses(app: GatewayApp) -> None:
    """The two cases a fault probe found: the schema allowed `messages: []` and `best_of: 0`."""
    import jsonschema

    doc = schemathesis.openapi.from_asgi("/openapi.json", app).raw_schema
    components = doc["components"]["schemas"]

    def valid(name: str, body: dict[str, Any]) -> bool:
        schema = {**components[name], "$defs": components}
        text = jsonschema.validators.Draft202012Validator(
            _rebase(schema), format_checker=None)
        return text.is_valid(body)

    assert not valid("ChatCompletionRequest", {"messages": []})
    assert valid("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}]})
    assert not valid("CompletionRequest", {"prompt": "hi", "best_of": 0})
    assert valid("CompletionRequest", {"prompt": "hi", "best_of": 1})


def _rebase(schema: Any) -> Any:
    """#/components/schemas/X -> #/$defs/X, so the component schema validates on its own."""
    if isinstance(schema, dict):
        return {k: (v.replace("#/components/schemas/", "#/$defs/") if k == "$ref" else _rebase(v))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rebase(v) for v in schema]
    return schema
