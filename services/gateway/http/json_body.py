"""Decoding a JSON request body into its Struct, with the two cases msgspec's fast path does not handle as JSON does.

- Nesting deeper than the decoder's recursion limit (even inside ignored fields) raises RecursionError: that is
  bad input, answered 400, never a 500.
- JSON has one number type: `2.0` is an integer to JSON Schema (and to pydantic-based OpenAI servers), but msgspec
  refuses it for an int field. Only when that happens is the body decoded again, whole floats turned into ints;
  strings stay strings ("10" for max_tokens is still refused). A completion prompt or embeddings input of token ids
  is a list of Any in its Struct, so its whole floats are turned into ints after decoding.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from services.gateway.openai.errors import bad_request

T = TypeVar("T")
_ANY_LISTS = ("prompt", "input")  # token-id fields typed list[Any] (completion prompt, embeddings input)


def _whole_floats_to_int(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [_whole_floats_to_int(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_floats_to_int(v) for k, v in value.items()}
    return value


def decode_body(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """The body as the decoder's type; msgspec.DecodeError (incl. ValidationError) for bad input, ApiError 400 for
    nesting that is too deep."""
    try:
        try:
            req = decoder.decode(body)
        except msgspec.ValidationError as e:
            if "got `float`" not in str(e):
                raise
            loose = _whole_floats_to_int(msgspec.json.decode(body))
            return msgspec.convert(loose, decoder.type)
        for field in _ANY_LISTS:
            value = getattr(req, field, None)
            if isinstance(value, list) and any(isinstance(t, (float, list)) for t in value):
                setattr(req, field, _whole_floats_to_int(value))
        return req
    except RecursionError:  # msgspec raises it for deeply nested JSON, even inside ignored fields
        raise bad_request("request body is nested too deeply; send flatter JSON", code="invalid_json") from None
