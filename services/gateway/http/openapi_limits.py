"""The value rules of services.gateway.openai.planning, as JSON Schema keywords merged into /openapi.json.

msgspec derives types from the request Structs; the ranges, the features this server refuses and two rules that
join fields live here, so that every body the published schema allows is one the server accepts (schemathesis'
positive cases must pass). When validation.py changes a rule, change it here too (tests/services/gateway/
test_gateway_schemathesis.py catches a mismatch). Keywords are merged at the property level: numeric and length
keywords apply only to values of their type, so `{"anyOf": [int, null], "minimum": 1}` still allows null.
Rules left out, described in the fields' descriptions (JSON Schema cannot compare two values): min_tokens <=
max_tokens, unique tool names, a named tool_choice naming one of the tools, that a schema, regex or grammar
compiles, and prompt_logprobs without stream=true (the schema generator cannot combine that rule with the others).
"""

from __future__ import annotations

from typing import Any

from services.gateway.http.embeddings import MAX_INPUTS
from services.gateway.openai.planning import (
    MAX_BATCH_PROMPTS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
)
from services.gateway.openai.tools.spec import MAX_PARALLEL_CALLS
from services.gateway.text.tokenizer import RESERVED_TEMPLATE_KWARGS

_REF = "#/components/schemas/{name}"
_STOP_STRING = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
_NULL = {"type": "null"}


def _below(n: int) -> str:
    """A regex matching the decimal integers in [0, n) without leading zeros (n >= 1): logit_bias keys."""
    digits = str(n - 1)
    alts = [f"[1-9][0-9]{{0,{len(digits) - 2}}}" if len(digits) > 2 else "[1-9]" if len(digits) == 2 else ""]
    for i, d in enumerate(digits):  # numbers as long as n - 1: equal on the first i digits, smaller on digit i
        lo = "1" if i == 0 else "0"
        if int(d) > int(lo):
            rest = len(digits) - i - 1
            alts.append(f"{digits[:i]}[{lo}-{int(d) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alts.append(digits)
    return "^(0|" + "|".join(a for a in alts if a) + ")$"


def _logit_bias(vocab_size: int | None) -> dict[str, Any]:
    return {
        "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
        "propertyNames": {"pattern": _below(vocab_size) if vocab_size else "^(0|[1-9][0-9]*)$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        "description": f"Token id (decimal string) -> bias in [-100, 100], at most {MAX_LOGIT_BIAS_ENTRIES} entries",
    }


def _only(field: str, value: dict[str, Any], others: tuple[str, ...]) -> dict[str, Any]:
    """structured_outputs with `field` set (to `value`) and every other constraint absent or null."""
    return {"required": [field], "properties": {field: value, **{o: _NULL for o in others if o != field}}}


_STRUCTURED_FIELDS = ("json", "regex", "choice", "grammar", "json_object")


def _structured_outputs() -> dict[str, Any]:
    # json_object: false counts as not set, so {"json_object": false, "regex": ...} is the regex case.
    shapes = [
        _only("json", {"type": "object"}, _STRUCTURED_FIELDS),
        _only("regex", {"type": "string"}, _STRUCTURED_FIELDS),
        _only("choice", {"type": "array", "items": {"type": "string"}}, _STRUCTURED_FIELDS),
        _only("grammar", {"type": "string"}, _STRUCTURED_FIELDS),
        _only("json_object", {"const": True}, _STRUCTURED_FIELDS),
    ]
    for shape in shapes[:4]:
        shape["properties"]["json_object"] = {"enum": [None, False]}
    return {
        "anyOf": [{"type": "object", "oneOf": shapes}, _NULL],
        "description": "Extension (vLLM): constrain the output; set exactly one of json (a JSON schema object; "
        "a JSON string of one is accepted too), regex, choice, grammar (EBNF, root rule 'root'), "
        "json_object. Not with response_format. A schema, regex or grammar that cannot compile "
        "is a 400 (invalid_schema / invalid_grammar)",
    }


def _common(vocab_size: int | None, context_length: int | None) -> dict[str, dict[str, Any]]:
    token = {"type": "integer", "minimum": 0, **({"maximum": vocab_size - 1} if vocab_size else {})}
    return {
        "max_tokens": {"minimum": 1, **({"maximum": context_length - 1} if context_length else {})},
        "temperature": {"minimum": 0, "maximum": 100},
        "top_p": {"exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"minimum": -1, **({"maximum": vocab_size} if vocab_size else {})},
        "min_p": {"minimum": 0, "maximum": 1},
        "seed": {"minimum": 0, "maximum": 2**63 - 1},
        "stop": {
            "minLength": 1,
            "maxLength": MAX_STOP_STRING_CHARS,
            "maxItems": MAX_STOP_STRINGS,
            "items": _STOP_STRING,
        },
        "n": {"minimum": 1, "maximum": MAX_N, "description": f"Choices per request, 1 to {MAX_N}; 1 with tools"},
        "presence_penalty": {"minimum": -2, "maximum": 2},
        "frequency_penalty": {"minimum": -2, "maximum": 2},
        "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 10},
        "min_tokens": {
            "minimum": 0,
            "description": "Extension: EOS and stop tokens are suppressed before this (at most max_tokens)",
        },
        "stop_token_ids": {"items": token},
        "logit_bias": _logit_bias(vocab_size),
        "structured_outputs": _structured_outputs(),
        "priority": {"minimum": 0, "maximum": 2**31 - 1},
        "prompt_logprobs": {"minimum": 0, "maximum": MAX_LOGPROBS},
    }


def _chat(vocab_size: int | None, context_length: int | None) -> dict[str, dict[str, Any]]:
    return {
        **_common(vocab_size, context_length),
        "messages": {"minItems": 1},
        "max_completion_tokens": {"minimum": 1, **({"maximum": context_length - 1} if context_length else {})},
        "top_logprobs": {"minimum": 0, "maximum": MAX_LOGPROBS},
        "tools": {
            "anyOf": [{"type": "array", "items": _TOOL}, _NULL],
            "description": "Functions the model may call; names unique (a 400 otherwise)",
        },
        "max_parallel_tool_calls": {"minimum": 1, "maximum": MAX_PARALLEL_CALLS},
        "chat_template_kwargs": {
            "propertyNames": {"not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)}},
            "description": "Extension: extra variables for the chat template; the names the gateway or transformers "
            "pass to the template themselves are refused (a 400): " + ", ".join(sorted(RESERVED_TEMPLATE_KWARGS)),
        },
        "tool_choice": {
            "anyOf": [{"enum": [None, "none", "auto", "required"]}, _NAMED_TOOL],
            "description": "auto / required / a named function need tools; the named function must be "
            "one of them (a 400 otherwise); required and named ones constrain the output, "
            "so they exclude response_format and structured_outputs",
        },
    }


def _completion(vocab_size: int | None, context_length: int | None) -> dict[str, dict[str, Any]]:
    token = {"type": "integer", "minimum": 0, **({"maximum": vocab_size - 1} if vocab_size else {})}
    ids = {"type": "array", "items": token, "minItems": 1}
    text = {"type": "string", "minLength": 1}
    return {
        **_common(vocab_size, context_length),
        "logprobs": {"minimum": 0, "maximum": MAX_LOGPROBS},
        "best_of": {"minimum": 1, "maximum": 1},
        "echo": {"description": "Prepend the prompt to the text (with logprobs: the prompt tokens' logprobs too)"},
        "suffix": {"maxLength": 0, "description": "Not supported: leave it out"},
        # One prompt (text or token ids), or a batch of them.
        "prompt": {
            "anyOf": [
                text,
                ids,
                {"type": "array", "items": {"anyOf": [text, ids]}, "minItems": 1, "maxItems": MAX_BATCH_PROMPTS},
            ]
        },
    }


_TOOL = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 64},
                "description": {"type": ["string", "null"]},
                "parameters": {"type": ["object", "null"], "description": "A JSON schema of the arguments"},
            },
        },
    },
}
_NAMED_TOOL = {
    "type": "object",
    "required": ["function"],
    "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    },
}

# Rules that join two fields, as if/then (JSON Schema 2020-12, what OpenAPI 3.1 uses).
_STREAM_OPTIONS_NEED_STREAM = {
    "if": {"not": {"properties": {"stream": {"const": True}}, "required": ["stream"]}},
    "then": {"properties": {"stream_options": {"type": "null"}}},
}
_TOP_LOGPROBS_NEED_LOGPROBS = {
    "if": {"not": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}},
    "then": {"properties": {"top_logprobs": {"enum": [None, 0]}}},
}
_SET = {"type": "object"}
_ONE_CONSTRAINT = {
    "not": {
        "required": ["response_format", "structured_outputs"],
        "properties": {"response_format": _SET, "structured_outputs": _SET},
    }
}
_HAS_TOOLS = {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}
_TOOL_CHOICE_NEEDS_TOOLS = {
    "if": {
        "required": ["tool_choice"],
        "properties": {"tool_choice": {"anyOf": [{"enum": ["auto", "required"]}, _SET]}},
    },
    "then": _HAS_TOOLS,
}
_CONSTRAINED_TOOLS_ALONE = {
    "if": {"required": ["tool_choice"], "properties": {"tool_choice": {"anyOf": [{"const": "required"}, _SET]}}},
    "then": {"properties": {"response_format": _NULL, "structured_outputs": _NULL}},
}
_TOOLS_ONE_CHOICE = {"if": _HAS_TOOLS, "then": {"properties": {"n": {"const": 1}}}}
# response_format type json_schema needs json_schema.schema (an object here; the server takes a JSON string too).
_JSON_SCHEMA_NEEDS_SCHEMA = {
    "if": {"required": ["type"], "properties": {"type": {"const": "json_schema"}}},
    "then": {
        "required": ["json_schema"],
        "properties": {
            "json_schema": {"type": "object", "required": ["schema"], "properties": {"schema": {"type": "object"}}}
        },
    },
}


def apply_limits(schemas: dict[str, Any], *, vocab_size: int | None = None, context_length: int | None = None) -> None:
    """Merge the server's value rules into msgspec's component schemas (in place)."""
    for name, rules in (
        ("ChatCompletionRequest", _chat(vocab_size, context_length)),
        ("CompletionRequest", _completion(vocab_size, context_length)),
    ):
        props = schemas[name]["properties"]
        for field, keywords in rules.items():
            if field == "prompt":
                props[field] = {"description": props[field].get("description", ""), **keywords}
            else:
                props[field] = {**props[field], **keywords}
        schemas[name]["allOf"] = [_STREAM_OPTIONS_NEED_STREAM] + (
            [
                _TOP_LOGPROBS_NEED_LOGPROBS,
                _ONE_CONSTRAINT,
                _TOOL_CHOICE_NEEDS_TOOLS,
                _CONSTRAINED_TOOLS_ALONE,
                _TOOLS_ONE_CHOICE,
            ]
            if name == "ChatCompletionRequest"
            else []
        )
    _tokenize_limits(schemas, vocab_size)
    _embedding_limits(schemas)
    # Text parts only: image and audio parts exist in the Structs so the error can name them.
    content = schemas["ChatMessage"]["properties"]["content"]
    content["anyOf"] = [
        {"type": "string"},
        {"type": "array", "items": {"$ref": _REF.format(name="TextPart")}},
        {"type": "null"},
    ]
    schemas["ResponseFormat"]["allOf"] = [_JSON_SCHEMA_NEEDS_SCHEMA]
    schemas["ResponseFormat"]["properties"]["type"]["description"] = (
        "json_schema needs json_schema.schema (an object, or a JSON string of one); a schema that cannot compile "
        "is a 400 (invalid_schema)"
    )


def _tokenize_limits(schemas: dict[str, Any], vocab_size: int | None) -> None:
    token = {"type": "integer", "minimum": 0, **({"maximum": vocab_size - 1} if vocab_size else {})}
    tokenize = schemas["TokenizeRequest"]
    # Messages as the chat template reads them (role and text content), where the chat route also takes parts.
    tokenize["properties"]["messages"] = {
        "anyOf": [
            {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {"role": {"enum": ["system", "user", "assistant"]}, "content": {"type": "string"}},
                },
            },
            _NULL,
        ],
        "description": "A conversation to template and tokenize (with the generation prompt)",
    }
    tokenize["properties"]["prompt"]["description"] = "Text to tokenize"
    tokenize["oneOf"] = [
        {"required": [field], "properties": {field: {"not": _NULL}, other: _NULL}}
        for field, other in (("prompt", "messages"), ("messages", "prompt"))
    ]
    tokenize["description"] = "Send exactly one of prompt or messages"
    schemas["DetokenizeRequest"]["properties"]["tokens"] = {"type": "array", "items": token}


def _embedding_limits(schemas: dict[str, Any]) -> None:
    text = {"type": "string", "minLength": 1}
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}}
    props = schemas["EmbeddingRequest"]["properties"]
    props["input"] = {
        "anyOf": [
            text,
            {**ids, "maxItems": MAX_INPUTS},
            {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": text},
            {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": ids},
        ],
        "description": f"A string, a list of strings, token ids or a list of token-id lists (at most "
        f"{MAX_INPUTS}); not a mix of texts and ids",
    }
    props["dimensions"] = {
        **props["dimensions"],
        "minimum": 1,
        "description": "Only sizes the model was trained for (Matryoshka models)",
    }
    props["truncate_prompt_tokens"] = {
        **props["truncate_prompt_tokens"],
        "minimum": -1,
        "description": "Extension (vLLM): -1 cuts inputs to the model's max sequence "
        "length, N to N tokens (at most that length); 0 or absent: "
        "an input over the limit is a 400",
    }
