"""The value rules of services.gateway.validation, as JSON Schema keywords merged into /openapi.json.

msgspec derives types from the request Structs; the ranges, the features this server refuses and two rules that
join fields live here, so that every body the published schema allows is one the server accepts (schemathesis'
positive cases must pass). When validation.py changes a rule, change it here too (tests/services/gateway/
test_gateway_schemathesis.py catches a mismatch). Keywords are merged at the property level: numeric and length
keywords apply only to values of their type, so `{"anyOf": [int, null], "minimum": 1}` still allows null.
The one rule left out: min_tokens <= max_tokens (JSON Schema cannot compare two fields); it is in the description.
"""

from __future__ import annotations

from typing import Any

from services.gateway.validation import (
    MAX_LOGPROBS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
)

_REF = "#/components/schemas/{name}"
_STOP_STRING = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}


def _common(vocab_size: int | None, context_length: int | None) -> dict[str, dict[str, Any]]:
    token = {"type": "integer", "minimum": 0, **({"maximum": vocab_size - 1} if vocab_size else {})}
    return {
        "max_tokens": {"minimum": 1, **({"maximum": context_length - 1} if context_length else {})},
        "temperature": {"minimum": 0, "maximum": 100},
        "top_p": {"exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"minimum": -1, **({"maximum": vocab_size} if vocab_size else {})},
        "min_p": {"minimum": 0, "maximum": 1},
        "seed": {"minimum": 0, "maximum": 2**63 - 1},
        "stop": {"minLength": 1, "maxLength": MAX_STOP_STRING_CHARS, "maxItems": MAX_STOP_STRINGS,
                 "items": _STOP_STRING},
        "n": {"minimum": 1, "maximum": 1},
        "presence_penalty": {"minimum": -2, "maximum": 2},
        "frequency_penalty": {"minimum": -2, "maximum": 2},
        "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 10},
        "min_tokens": {"minimum": 0, "description": "Extension: EOS and stop tokens are suppressed before this "
                                                    "(at most max_tokens)"},
        "stop_token_ids": {"items": token},
        "logit_bias": {"maxProperties": 0, "description": "Not supported: leave it out (or send {})"},
    }


def _chat(vocab_size: int | None, context_length: int | None) -> dict[str, dict[str, Any]]:
    return {
        **_common(vocab_size, context_length),
        "messages": {"minItems": 1},
        "max_completion_tokens": {"minimum": 1, **({"maximum": context_length - 1} if context_length else {})},
        "top_logprobs": {"minimum": 0, "maximum": MAX_LOGPROBS},
        "tools": {"maxItems": 0, "description": "Tool calling is not supported: leave it out"},
        "tool_choice": {"enum": [None, "none"]},
    }


def _completion(vocab_size: int | None, context_length: int | None) -> dict[str, dict[str, Any]]:
    token = {"type": "integer", "minimum": 0, **({"maximum": vocab_size - 1} if vocab_size else {})}
    ids = {"type": "array", "items": token, "minItems": 1}
    text = {"type": "string", "minLength": 1}
    return {
        **_common(vocab_size, context_length),
        "logprobs": {"minimum": 0, "maximum": MAX_LOGPROBS},
        "best_of": {"minimum": 1, "maximum": 1},
        "echo": {"const": False, "description": "echo=true is not supported"},
        "suffix": {"maxLength": 0, "description": "Not supported: leave it out"},
        # One prompt: text, token ids, or a batch of one of either.
        "prompt": {"anyOf": [text, ids, {"type": "array", "items": text, "minItems": 1, "maxItems": 1},
                             {"type": "array", "items": ids, "minItems": 1, "maxItems": 1}]},
    }


# Rules that join two fields, as if/then (JSON Schema 2020-12, what OpenAPI 3.1 uses).
_STREAM_OPTIONS_NEED_STREAM = {"if": {"not": {"properties": {"stream": {"const": True}}, "required": ["stream"]}},
                               "then": {"properties": {"stream_options": {"type": "null"}}}}
_TOP_LOGPROBS_NEED_LOGPROBS = {"if": {"not": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}},
                               "then": {"properties": {"top_logprobs": {"enum": [None, 0]}}}}


def apply_limits(schemas: dict[str, Any], *, vocab_size: int | None = None,
                 context_length: int | None = None) -> None:
    """Merge the server's value rules into msgspec's component schemas (in place)."""
    for name, rules in (("ChatCompletionRequest", _chat(vocab_size, context_length)),
                        ("CompletionRequest", _completion(vocab_size, context_length))):
        props = schemas[name]["properties"]
        for field, keywords in rules.items():
            if field == "prompt":
                props[field] = {"description": props[field].get("description", ""), **keywords}
            else:
                props[field] = {**props[field], **keywords}
        schemas[name]["allOf"] = [_STREAM_OPTIONS_NEED_STREAM] + (
            [_TOP_LOGPROBS_NEED_LOGPROBS] if name == "ChatCompletionRequest" else [])
    # Text parts only: image and audio parts exist in the Structs so the error can name them.
    content = schemas["ChatMessage"]["properties"]["content"]
    content["anyOf"] = [{"type": "string"}, {"type": "array", "items": {"$ref": _REF.format(name="TextPart")}},
                        {"type": "null"}]
    schemas["ResponseFormat"]["properties"]["type"] = {"enum": ["text"], "default": "text",
                                                       "description": "Only 'text' is supported"}
