"""schemathesis against the gateway (mock backend, in process): every body /openapi.json allows is answered 2xx,
and every answer matches the schema (status codes, content types, JSON bodies and each SSE event).

Positive cases only, a bounded number per operation (a few seconds; PDRELAY_FUZZ_EXAMPLES=N for a long run), drawn
from a fixed seed (derandomize): the random search for bad inputs is test_gateway_fuzz.py's. A made-up model name
may get 404. The only 400s allowed for schema-valid bodies are the rules JSON Schema cannot state (see
`_cross_field_refusal`).
"""

from __future__ import annotations

import os
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

from services.gateway.http.app import GatewayApp
from services.gateway.http.embeddings import Embeddings
from tests.services.gateway.conftest import StandInEncoders

EXAMPLES = int(os.environ.get("PDRELAY_FUZZ_EXAMPLES", "40"))  # per operation; test_gateway_fuzz.py says more
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _cross_field_refusal(response: Any) -> bool:
    """A 400 for one of the rules the schema can only describe in words: prompt + max_tokens within the context,
    min_tokens <= max_tokens, a JSON schema / regex / grammar that does not compile (whether one does is the
    grammar compiler's call), unique tool names, a named tool_choice naming one of the tools, and prompt_logprobs
    without stream=true."""
    if response.status_code != 400:
        return False
    error = response.json()["error"]
    message = error["message"]
    return (
        error.get("code") in ("context_length_exceeded", "invalid_schema", "invalid_grammar")
        or (error.get("param") == "min_tokens" and "max_tokens" in message)
        or (error.get("param") == "tools" and "names must be unique" in message)
        or (error.get("param") == "tool_choice" and "which is not in tools" in message)
        or (error.get("param") == "prompt_logprobs" and "stream=true" in message)
    )


@pytest.mark.parametrize(
    "path,method",
    [
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
        ("/v1/models", "GET"),
        ("/v1/embeddings", "POST"),
        ("/tokenize", "POST"),
        ("/detokenize", "POST"),
    ],
)
def test_positive_cases_are_accepted_and_conform(app: GatewayApp, path: str, method: str) -> None:
    embeddings = Embeddings(StandInEncoders())  # type: ignore[arg-type]
    app.add_route("/v1/embeddings", "POST", embeddings.http, models=embeddings.model_cards)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operation = schema[path][method]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=[Phase.generate],
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def run(case: schemathesis.Case) -> None:
        response = case.call()
        case.validate_response(response, checks=CHECKS)
        # Like schemathesis' positive_data_acceptance: 404 (a model name it made up) is not a refusal of the body.
        assert response.status_code < 300 or response.status_code == 404 or _cross_field_refusal(response), (
            f"schema-valid body refused: {case.body!r:.300} -> {response.status_code} {response.text[:300]}"
        )

    run()


def test_schema_refuses_what_the_server_refuses(app: GatewayApp) -> None:
    """The two cases a fault probe found: the schema allowed `messages: []` and `best_of: 0`."""
    import jsonschema

    doc = schemathesis.openapi.from_asgi("/openapi.json", app).raw_schema
    components = doc["components"]["schemas"]

    def valid(name: str, body: dict[str, Any]) -> bool:
        schema = {**components[name], "$defs": components}
        text = jsonschema.validators.Draft202012Validator(_rebase(schema), format_checker=None)
        return text.is_valid(body)

    assert not valid("ChatCompletionRequest", {"messages": []})
    assert valid("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}]})
    assert not valid("CompletionRequest", {"prompt": "hi", "best_of": 0})
    assert valid("CompletionRequest", {"prompt": "hi", "best_of": 1})
    # The grown API: its rules are in the schema too.
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert not valid("ChatCompletionRequest", {**chat, "structured_outputs": {}})
    assert not valid("ChatCompletionRequest", {**chat, "structured_outputs": {"regex": "a+", "choice": ["a"]}})
    assert valid("ChatCompletionRequest", {**chat, "structured_outputs": {"regex": "a+", "json_object": False}})
    assert valid("ChatCompletionRequest", {**chat, "n": 64}) and not valid("ChatCompletionRequest", {**chat, "n": 65})
    assert valid("ChatCompletionRequest", {**chat, "logit_bias": {"0": -100, "480": 100}})
    assert not valid("ChatCompletionRequest", {**chat, "logit_bias": {"481": 1}})  # vocab_size is 481
    assert not valid("ChatCompletionRequest", {**chat, "logit_bias": {"01": 1}})
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert valid("ChatCompletionRequest", {**chat, "tools": [tool], "tool_choice": "required"})
    assert not valid("ChatCompletionRequest", {**chat, "tool_choice": "required"})
    assert not valid("ChatCompletionRequest", {**chat, "tools": [tool], "n": 2})
    assert not valid(
        "ChatCompletionRequest",
        {**chat, "tools": [tool], "tool_choice": "required", "response_format": {"type": "json_object"}},
    )
    assert not valid("ChatCompletionRequest", {**chat, "response_format": {"type": "json_schema"}})
    assert valid("CompletionRequest", {"prompt": ["a", [1, 2]], "echo": True})
    assert not valid("CompletionRequest", {"prompt": ["a"] * 65})
    assert not valid("TokenizeRequest", {})
    assert not valid("EmbeddingRequest", {"input": []})


def _rebase(schema: Any) -> Any:
    """#/components/schemas/X -> #/$defs/X, so the component schema validates on its own."""
    if isinstance(schema, dict):
        return {
            k: (v.replace("#/components/schemas/", "#/$defs/") if k == "$ref" else _rebase(v))
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_rebase(v) for v in schema]
    return schema
