"""Spec -> xgrammar Grammar (tokenizer-independent), with errors that name the part of the schema at fault.

The gateway calls this to refuse what can never compile with a 400 before any worker sees it; the engine builds its
token-level matcher from the same Grammar, so both agree on what is accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from shared.grammar.spec import GrammarKind, StructuredSpec

_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[17:50:19] /project/cpp/x.cc:94: " from xgrammar
_SUBSCHEMA_KEYS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "contains")


class GrammarError(ValueError):
    """The spec cannot become a grammar. `path` points into the schema (e.g. "properties.date.pattern")."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


def _clean(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    msg = _CPP_PREFIX.sub("", msg)
    return msg.replace("Check failed: (error.empty()) is false: ", "")


def _children(schema: Any) -> Iterator[tuple[str, Any]]:
    if not isinstance(schema, dict):
        return
    for key in _SUBSCHEMA_KEYS:
        sub = schema.get(key)
        if isinstance(sub, dict):
            for name, s in sub.items():
                yield f"{key}.{name}", s
    for key in _SUBSCHEMA_LISTS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, s in enumerate(sub):
                yield f"{key}[{i}]", s
    for key in _SUBSCHEMA_ONE:
        if isinstance(schema.get(key), dict):
            yield key, schema[key]


def _fails(schema: Any) -> str | None:
    import xgrammar as xgr

    try:
        xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError for every kind of schema problem
        return _clean(e)
    return None


def _locate(schema: Any, message: str, path: str = "") -> str:
    """The deepest sub-schema that fails on its own with the same message (refs into $defs fail alone for
    another reason, so they are never blamed)."""
    for sub_path, sub in _children(schema):
        if isinstance(sub, dict) and "$ref" not in json.dumps(sub) and _fails(sub) == message:
            here = f"{path}.{sub_path}" if path else sub_path
            deeper = _locate(sub, message, here)
            if deeper == here and isinstance(sub, dict) and "pattern" in sub and "regex" in message.lower():
                return f"{here}.pattern"
            return deeper
    return path


# xgrammar 0.2.9 writes the characters of a length-bounded string (minLength / maxLength) as [^"\\\r\n], which
# lets raw control characters (U+0000-U+001F) into a JSON string: no strict JSON parser reads that back. Its
# unbounded strings exclude them; give bounded ones the same class.
_LOOSE_STRING_CHARS = r"[^\"\\\r\n]"
_JSON_STRING_CHARS = r"[^\0-\x1f\"\\\r\n]"


def _json_safe(grammar):  # xgrammar.Grammar -> xgrammar.Grammar
    import xgrammar as xgr

    text = str(grammar)
    if _LOOSE_STRING_CHARS not in text:
        return grammar
    return xgr.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHARS, _JSON_STRING_CHARS))


def build_grammar(spec: StructuredSpec):  # -> xgrammar.Grammar
    """Raises GrammarError naming what is wrong and where."""
    import xgrammar as xgr

    kind = spec.kind
    try:
        if kind is GrammarKind.JSON_OBJECT:
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if kind is GrammarKind.JSON_SCHEMA:
            try:
                schema = json.loads(spec.spec)
            except ValueError as e:
                raise GrammarError(f"the schema is not valid JSON: {e}") from None
            if not isinstance(schema, dict | bool):
                raise GrammarError(f"the schema must be a JSON object (got {type(schema).__name__})")
            try:
                return _json_safe(xgr.Grammar.from_json_schema(spec.spec, any_whitespace=False, strict_mode=True))
            except Exception as e:  # noqa: BLE001
                msg = _clean(e)
                where = _locate(schema, msg)
                raise GrammarError(f"{where}: {msg}" if where else msg, where) from None
        if kind is GrammarKind.REGEX:
            return xgr.Grammar.from_regex(spec.spec)
        if kind is GrammarKind.CHOICE:
            choices = spec.choices()
            if not choices or any(not c for c in choices):
                raise GrammarError("choices must be a non-empty list of non-empty strings")
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices))
        if kind is GrammarKind.GRAMMAR:
            return xgr.Grammar.from_ebnf(spec.spec)
    except GrammarError:
        raise
    except Exception as e:  # noqa: BLE001
        raise GrammarError(_clean(e)) from None
    raise AssertionError(f"unhandled grammar kind {kind}")
