"""response_format and the structured_outputs extension -> one StructuredSpec, checked before any worker sees it.

The schema (or regex / grammar) is turned into an xgrammar Grammar here, tokenizer-free and in well under a
millisecond, so what can never compile is a 400 naming the part at fault; the engine compiles the same spec
against its tokenizer (shared/engine/grammar).
"""

from __future__ import annotations

import json
from typing import Any

from services.gateway.openai.errors import ApiError, bad_request
from services.gateway.openai.requests import ResponseFormat, StructuredOutputs
from shared.grammar.check import GrammarError, build_grammar
from shared.grammar.spec import GrammarKind, StructuredSpec


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise bad_request(f"{param}: the schema string is not valid JSON ({e})", param) from None
    if not isinstance(schema, dict):
        raise bad_request(f"{param} must be a JSON schema object (got {type(schema).__name__})", param)
    return json.dumps(schema, sort_keys=True, ensure_ascii=False)


def _from_response_format(rf: ResponseFormat) -> StructuredSpec | None:
    if rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredSpec(GrammarKind.JSON_OBJECT)
    if rf.json_schema is None or rf.json_schema.schema is None:
        raise bad_request(
            "response_format.json_schema.schema is required with type json_schema", "response_format.json_schema.schema"
        )
    return StructuredSpec(
        GrammarKind.JSON_SCHEMA, _schema_text(rf.json_schema.schema, "response_format.json_schema.schema")
    )


def _from_structured_outputs(so: StructuredOutputs) -> StructuredSpec:
    given: list[tuple[str, Any]] = [
        (name, v)
        for name, v in (
            ("json", so.json),
            ("regex", so.regex),
            ("choice", so.choice),
            ("grammar", so.grammar),
            ("json_object", so.json_object or None),
        )
        if v is not None
    ]
    if len(given) != 1:
        raise bad_request(
            f"structured_outputs: set exactly one of json, regex, choice, grammar, json_object (got "
            f"{', '.join(n for n, _ in given) or 'none'})",
            "structured_outputs",
        )
    name, value = given[0]
    if name == "json":
        return StructuredSpec(GrammarKind.JSON_SCHEMA, _schema_text(value, "structured_outputs.json"))
    if name == "regex":
        return StructuredSpec(GrammarKind.REGEX, value)
    if name == "choice":
        return StructuredSpec(GrammarKind.CHOICE, json.dumps(list(value), ensure_ascii=False))
    if name == "grammar":
        return StructuredSpec(GrammarKind.GRAMMAR, value)
    return StructuredSpec(GrammarKind.JSON_OBJECT)


def structured_spec(
    response_format: ResponseFormat | None,
    structured_outputs: StructuredOutputs | None,
) -> StructuredSpec | None:
    """The request's constraint (None: free text). Raises ApiError (400) for a spec that cannot compile."""
    spec = _from_response_format(response_format) if response_format is not None else None
    param = "response_format"
    if structured_outputs is not None:
        if spec is not None:
            raise bad_request("send either response_format or structured_outputs, not both", "structured_outputs")
        spec, param = _from_structured_outputs(structured_outputs), "structured_outputs"
    if spec is None:
        return None
    check(spec, param)
    return spec


def check(spec: StructuredSpec, param: str) -> None:
    try:
        build_grammar(spec)
    except GrammarError as e:
        where = ".json_schema.schema" if spec.kind is GrammarKind.JSON_SCHEMA and param == "response_format" else ""
        raise ApiError(
            400,
            f"{param}{where}: cannot be compiled into a grammar: {e}",
            param=param,
            code="invalid_schema" if spec.kind is GrammarKind.JSON_SCHEMA else "invalid_grammar",
        ) from None
