"""JSON schemas for structured-output tests: nested objects, arrays, enums, numbers, required / optional fields,
string formats and patterns xgrammar supports. Every string is bounded (maxLength, enum, pattern) and every array
has maxItems: a random-weight model would otherwise write one string until max_tokens, and a truncated answer is
no answer. MAX_TOKENS covers the longest output each schema allows."""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 160


def _s(n: int = 8) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def _obj(props: dict[str, Any], required: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
        **kw,
    }


_INT = {"type": "integer", "minimum": 0, "maximum": 999}
_NUM = {"type": "number", "minimum": -100, "maximum": 100}
_BOOL = {"type": "boolean"}
_COLOR = {"type": "string", "enum": ["red", "green", "blue"]}

SCHEMAS: list[dict[str, Any]] = [
    # flat objects
    _obj({"name": _s()}),
    _obj({"name": _s(), "age": _INT}),
    _obj({"ok": _BOOL}),
    _obj({"x": _NUM, "y": _NUM}),
    _obj({"color": _COLOR}),
    _obj({"id": _INT, "label": _s(6), "active": _BOOL}),
    _obj({"count": {"type": "integer", "minimum": 1, "maximum": 9}}),
    _obj({"temperature": {"type": "number", "minimum": -50, "maximum": 60}}),
    _obj({"city": _s(10), "country": _s(10)}),
    _obj({"answer": {"type": "string", "enum": ["yes", "no", "maybe"]}}),
    # optional fields
    _obj({"name": _s(), "nickname": _s()}, required=["name"]),
    _obj({"a": _INT, "b": _INT, "c": _INT}, required=["a"]),
    _obj({"title": _s(), "subtitle": _s(), "pages": _INT}, required=["title", "pages"]),
    _obj({"flag": _BOOL, "note": _s()}, required=[]),
    _obj({"k": _COLOR, "v": _NUM}, required=["v"]),
    # enums and consts
    {"type": "string", "enum": ["alpha", "beta", "gamma"]},
    {"enum": [1, 2, 3, "four", None]},
    _obj({"kind": {"const": "point"}, "x": _INT}),
    _obj({"level": {"type": "integer", "enum": [1, 2, 3]}}),
    _obj({"status": {"type": "string", "enum": ["open", "closed"]}, "priority": {"enum": ["low", "high"]}}),
    # numbers
    {"type": "integer", "minimum": 0, "maximum": 100},
    {"type": "number", "minimum": 0, "maximum": 1},
    _obj({"score": {"type": "number", "minimum": 0, "maximum": 10}}),
    _obj({"year": {"type": "integer", "minimum": 1900, "maximum": 2100}}),
    _obj({"neg": {"type": "integer", "minimum": -99, "maximum": -1}}),
    # arrays
    {"type": "array", "items": _INT, "maxItems": 4},
    {"type": "array", "items": _s(5), "minItems": 1, "maxItems": 3},
    _obj({"tags": {"type": "array", "items": _s(6), "maxItems": 3}}),
    _obj({"values": {"type": "array", "items": _NUM, "minItems": 2, "maxItems": 4}}),
    _obj({"flags": {"type": "array", "items": _BOOL, "maxItems": 5}}),
    _obj({"colors": {"type": "array", "items": _COLOR, "minItems": 1, "maxItems": 3}}),
    {"type": "array", "items": _obj({"n": _INT}), "maxItems": 3},
    {"type": "array", "prefixItems": [_INT, _s(5)], "items": False},
    # nested objects
    _obj({"person": _obj({"name": _s(), "age": _INT})}),
    _obj({"a": _obj({"b": _obj({"c": _INT})})}),
    _obj({"user": _obj({"id": _INT, "email": _s(12)}), "admin": _BOOL}),
    _obj({"point": _obj({"x": _NUM, "y": _NUM}), "label": _s()}),
    _obj({"meta": _obj({"version": _INT, "draft": _BOOL}, required=["version"])}),
    _obj({"items": {"type": "array", "items": _obj({"sku": _s(6), "qty": _INT}), "maxItems": 3}}),
    _obj({"matrix": {"type": "array", "items": {"type": "array", "items": _INT, "maxItems": 3}, "maxItems": 3}}),
    _obj(
        {"order": _obj({"id": _INT, "lines": {"type": "array", "items": _obj({"p": _s(4), "q": _INT}), "maxItems": 2}})}
    ),
    _obj({"config": _obj({"mode": _COLOR, "limits": _obj({"lo": _INT, "hi": _INT})})}),
    # patterns and formats
    _obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    _obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}),
    _obj({"word": {"type": "string", "pattern": "^[a-z]{1,8}$"}}),
    _obj({"date": {"type": "string", "format": "date"}}),
    _obj({"phone": {"type": "string", "pattern": "^\\+?[0-9]{7,10}$"}}),
    # unions, refs, nullable
    _obj({"v": {"anyOf": [_INT, _BOOL]}}),
    _obj({"maybe": {"anyOf": [_s(), {"type": "null"}]}}),
    _obj({"val": {"type": ["integer", "null"], "minimum": 0, "maximum": 9}}),
    {"$defs": {"pt": _obj({"x": _INT, "y": _INT})}, **_obj({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    _obj({"shape": {"oneOf": [_obj({"r": _INT}), _obj({"w": _INT, "h": _INT})]}}),
    # strings with length bounds
    {"type": "string", "minLength": 2, "maxLength": 6},
    _obj({"short": {"type": "string", "minLength": 1, "maxLength": 3}, "n": _INT}),
    {"type": "boolean"},
    {"type": "null"},
]
