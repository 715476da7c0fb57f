"""/openapi.json, generated from the very Structs the server decodes requests into and encodes answers from."""

from __future__ import annotations

from typing import Any

import msgspec

from services.gateway.http.embeddings import EmbeddingRequest, EmbeddingResponse
from services.gateway.http.openapi_limits import apply_limits
from services.gateway.http.tokenize_api import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from services.gateway.openai.requests import ChatCompletionRequest, CompletionRequest
from services.gateway.openai.responses import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionResponse,
    ErrorResponse,
    HealthStatus,
    ModelList,
)

_REF = "#/components/schemas/{name}"
_ERROR_CODES = {
    "400": "Invalid request (the body names the parameter and the fix)",
    "401": "Missing or invalid API key",
    "404": "Unknown model",
    "413": "Request body too large",
    "415": "The body is not JSON (Content-Type)",
    "429": "Overloaded; retry after Retry-After seconds",
    "500": "Gateway or backend failure",
    "503": "No worker available; retry after Retry-After seconds",
    "504": "A worker did not answer in time",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _errors(codes: tuple[str, ...]) -> dict[str, Any]:
    return {
        c: {"description": _ERROR_CODES[c], "content": {"application/json": {"schema": _ref("ErrorResponse")}}}
        for c in codes
    }


def _sse_event(chunk: str) -> dict[str, Any]:
    """One server-sent event (OpenAPI 3.1 describes each event of a stream): `data` is a JSON chunk, an error
    body (a failure after the stream started), or the final `[DONE]`."""
    payload = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [_ref(chunk), _ref("ErrorResponse")]},
    }
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"event": {"type": "string"}, "data": {"anyOf": [{"const": "[DONE]"}, payload]}},
    }


def _generation(summary: str, request: str, response: str, chunk: str, auth: bool) -> dict[str, Any]:
    codes = (
        ("400", "401", "404", "413", "415", "429", "500", "503", "504")
        if auth
        else ("400", "404", "413", "415", "429", "500", "503", "504")
    )
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": "The completion; with stream=true, server-sent events `data: <chunk>` ending "
                    "with `data: [DONE]`",
                    "content": {
                        "application/json": {"schema": _ref(response)},
                        "text/event-stream": {"schema": _sse_event(chunk)},
                    },
                },
                **_errors(codes),
            },
            **({"security": [{"bearer": []}]} if auth else {}),
        }
    }


def _get(
    summary: str,
    schema: str | None,
    content_type: str = "application/json",
    *,
    auth: bool = False,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": _ref(schema)} if schema else {"schema": {"type": "string"}}
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": "OK", "content": {content_type: body}},
            **_errors(extra + (("401",) if auth else ())),
        },
    }
    if auth:
        op["security"] = [{"bearer": []}]
    return {"get": op}


def _post(summary: str, request: str, response: str, auth: bool, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref(response)}}},
            **_errors(("400", "404") + extra + (("401",) if auth else ())),
        },
    }
    if auth:
        op["security"] = [{"bearer": []}]
    return {"post": op}


def build_openapi(
    *,
    auth: bool,
    title: str = "pdrelay gateway",
    version: str = "0.1.0",
    vocab_size: int | None = None,
    context_length: int | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document. `auth`: whether /v1 routes require `Authorization: Bearer <key>`; `vocab_size`
    and `context_length` (of the served model) bound token ids and max_tokens."""
    _, schemas = msgspec.json.schema_components(
        [
            ChatCompletionRequest,
            CompletionRequest,
            ChatCompletionResponse,
            ChatCompletionChunk,
            CompletionResponse,
            CompletionChunk,
            ModelList,
            ErrorResponse,
            HealthStatus,
            TokenizeRequest,
            TokenizeResponse,
            DetokenizeRequest,
            DetokenizeResponse,
            EmbeddingRequest,
            EmbeddingResponse,
        ],
        ref_template=_REF,
    )
    apply_limits(schemas, vocab_size=vocab_size, context_length=context_length)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "OpenAI-compatible API of the pdrelay gateway (prefill/decode disaggregated).",
        },
        "paths": {
            "/v1/chat/completions": _generation(
                "Chat completion", "ChatCompletionRequest", "ChatCompletionResponse", "ChatCompletionChunk", auth
            ),
            "/v1/completions": _generation(
                "Text completion", "CompletionRequest", "CompletionResponse", "CompletionChunk", auth
            ),
            "/v1/models": _get("Served models", "ModelList", auth=auth),
            "/v1/embeddings": _post(
                "Embeddings of texts or token ids (served where the cluster runs encoders)",
                "EmbeddingRequest",
                "EmbeddingResponse",
                auth,
                extra=("413", "415", "429", "500", "503", "504"),
            ),
            "/tokenize": _post(
                "Token ids of a prompt or a templated conversation (vLLM's /tokenize)",
                "TokenizeRequest",
                "TokenizeResponse",
                auth,
            ),
            "/detokenize": _post(
                "Text of token ids (vLLM's /detokenize)", "DetokenizeRequest", "DetokenizeResponse", auth
            ),
            "/health": _get("Liveness of the gateway process", "HealthStatus"),
            "/ready": _get(
                "Readiness: a request sent now could be served (503 when not)", "HealthStatus", extra=("503",)
            ),
            "/metrics": _get("Prometheus metrics", None, "text/plain"),
            "/openapi.json": _get("This document", None, "application/json"),
        },
        "components": {"schemas": schemas},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
