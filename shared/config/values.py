"""Turning raw input (CLI text, env text, YAML/JSON values) into a field's typed value, and checking it.

The accepted types are read off the field's annotation: int, float, str, bool, a StrEnum of shared/config/choices.py
(a closed set: the text must be one of its values), ``X | None`` and ``tuple[X, ...]``. Every rejection names where the value came from (flag, env twin or file key), the value,
and what to do instead.
"""

from __future__ import annotations

import difflib
import enum
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from shared.config.errors import ConfigError
from shared.config.fields import FieldSpec

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
NONE_WORDS = frozenset({"", "none", "null"})

# Byte-size fields (names ending in `_bytes`) also accept units, e.g. "4GiB" or "512MB": nobody types 2**32.
_BYTE_UNITS = {
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_BYTES_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([A-Za-z]+)$")


@dataclass(frozen=True)
class Kind:
    """The shape of a field's type: a scalar base type, optionally nullable, optionally a tuple of it."""

    base: type  # int | float | str | bool | a StrEnum
    optional: bool = False
    is_tuple: bool = False


def kind_of(tp: Any) -> Kind:
    """Reads ``int``, ``str | None``, ``tuple[int, ...]`` (and ``tuple[str, ...] | None``) into a Kind."""
    optional = False
    origin = typing.get_origin(tp)
    if origin is types.UnionType or origin is typing.Union:
        args = tuple(a for a in typing.get_args(tp) if a is not type(None))
        assert len(args) == 1, f"unsupported union type {tp!r}: only `X | None` is allowed"
        optional, tp, origin = True, args[0], typing.get_origin(args[0])
    if origin is tuple:
        args = typing.get_args(tp)
        assert len(args) == 2 and args[1] is Ellipsis, f"unsupported tuple type {tp!r}: use tuple[X, ...]"
        assert args[0] in (int, float, str, bool), f"unsupported tuple item type {args[0]!r}"
        return Kind(args[0], optional, True)
    assert tp in (int, float, str, bool) or _is_choice(tp), f"unsupported field type {tp!r}"
    return Kind(tp, optional, False)


def _is_choice(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.StrEnum)


def as_member(spec: FieldSpec, value: Any) -> Any:
    """`value` (already valid) with the text of an enum-typed field turned into its member."""
    base = kind_of(spec.type).base
    if not _is_choice(base) or value is None or isinstance(value, base):
        return value
    if isinstance(value, tuple):
        return tuple(base(v) for v in value)
    return base(value)


def _members(base: type) -> tuple[enum.StrEnum, ...]:
    """The members of a StrEnum field type (only called where _is_choice(base))."""
    return tuple(typing.cast("type[enum.StrEnum]", base))


@dataclass(frozen=True)
class Origin:
    """Where a raw value came from, so that messages speak the user's language.

    source: "cli" | "env" | "file" | "json" | "default" | "derived"; name: the flag as typed ("--model-path"),
    the env var ("PDRELAY_PAGE_SIZE") or the file key ("page_size"); file: the config file, for source "file".
    """

    source: str
    name: str
    file: str | None = None

    def show(self, text: str) -> str:
        """The value as the user wrote it: `--page-size 12`, `PDRELAY_PAGE_SIZE=12`, `page_size: 12 in x.yaml`."""
        if self.source == "env":
            return f"{self.name}={text}"
        if self.source in ("file", "json"):
            return f"{self.name}: {text} in {self.file or 'the JSON config'}"
        return f"{self.name} {text}"

    def example(self, text: str) -> str:
        """How to write a value from the same source: `--page-size 16`, `PDRELAY_PAGE_SIZE=16`, `page_size: 16`."""
        return f"{self.name}: {text}" if self.source in ("file", "json") else self.show(text)

    def fail(self, text: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"{self.show(text)} {problem}; {fix}")


def format_value(value: Any) -> str:
    """A value as a user would type it on the command line (tuples comma-separated, None as 'none')."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    return str(value)


def _shown(text: str) -> str:
    return repr(text) if text == "" or any(c.isspace() for c in text) else text


_KIND_WORDS = {int: "an integer", float: "a number", str: "text", bool: "true or false"}


def _parse_scalar(spec: FieldSpec, base: type, text: str, origin: Origin, whole: str) -> Any:
    """One scalar from text. `whole` is the full raw text, shown in messages (it may be a comma list)."""
    example = format_value(spec.default) if spec.default not in (None, ()) else _example_for(base)
    if base is str:
        return text
    if _is_choice(base):
        try:
            return base(text.strip())
        except ValueError:
            raise _not_a_choice(_shown(whole), text.strip(), _members(base), origin) from None
    t = text.strip()
    if base is bool:
        if t.lower() in TRUE_WORDS:
            return True
        if t.lower() in FALSE_WORDS:
            return False
        raise origin.fail(
            _shown(whole),
            "is not true or false",
            f"use one of {', '.join(sorted(TRUE_WORDS))} or {', '.join(sorted(FALSE_WORDS))}",
        )
    if base is int:
        if spec.name.endswith("_bytes") and (m := _BYTES_RE.match(t)) and m.group(2).lower() in _BYTE_UNITS:
            return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])
        try:
            return int(t, 10)
        except ValueError:
            units = " (units such as 4GiB or 512MB work too)" if spec.name.endswith("_bytes") else ""
            raise origin.fail(_shown(whole), "is not an integer", f"e.g. {origin.example(example)}{units}") from None
    assert base is float
    try:
        value = float(t)
    except ValueError:
        raise origin.fail(_shown(whole), "is not a number", f"e.g. {origin.example(example)}") from None
    if not math.isfinite(value):
        raise origin.fail(_shown(whole), "is not a finite number", f"e.g. {origin.example(example)}")
    return value


def _example_for(base: type) -> str:
    if _is_choice(base):
        return format_value(_members(base)[0])
    return {int: "1", float: "0.5", str: "text", bool: "true"}[base]


def _not_a_choice(shown: str, text: str, choices: tuple[Any, ...], origin: Origin) -> ConfigError:
    names = [format_value(c) for c in choices]
    close = difflib.get_close_matches(text, names, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return origin.fail(shown, "is not a valid choice", f"choose one of: {', '.join(names)}{hint}")


def parse_text(spec: FieldSpec, text: str, origin: Origin) -> Any:
    """Typed value of `spec` from CLI or env text ('none'/'' mean None for optional fields; tuples comma-separated)."""
    kind = kind_of(spec.type)
    if kind.optional and text.strip().lower() in NONE_WORDS:
        return None
    if kind.is_tuple:
        if text.strip() == "":
            return ()
        items = [p.strip() for p in text.split(",")]
        if any(p == "" for p in items):
            raise origin.fail(
                _shown(text),
                "has an empty item",
                f"separate items with single commas, e.g. "
                f"{origin.example(format_value(spec.default) or _example_for(kind.base))}",
            )
        return tuple(_parse_scalar(spec, kind.base, p, origin, text) for p in items)
    return _parse_scalar(spec, kind.base, text, origin, text)


def _coerce_scalar(spec: FieldSpec, base: type, raw: Any, origin: Origin) -> Any:
    if isinstance(raw, str):
        if base is str:
            return raw
        return _parse_scalar(spec, base, raw, origin, raw)
    if _is_choice(base):
        raise _not_a_choice(_shown(format_value(raw)), format_value(raw), _members(base), origin)
    ok = (
        isinstance(raw, bool)
        if base is bool
        else isinstance(raw, int) and not isinstance(raw, bool)
        if base is int
        else isinstance(raw, (int, float)) and not isinstance(raw, bool)
        if base is float
        else False
    )
    if not ok:
        fix = "quote it" if base is str else f"e.g. {origin.example(format_value(spec.default))}"
        raise origin.fail(_shown(format_value(raw)), f"is not {_KIND_WORDS[base]}", fix)
    if base is float:
        value = float(raw)
        if not math.isfinite(value):
            raise origin.fail(format_value(raw), "is not a finite number", f"e.g. {origin.example(str(spec.default))}")
        return value
    return raw


def coerce(spec: FieldSpec, raw: Any, origin: Origin) -> Any:
    """Typed value of `spec` from a YAML/JSON value (already typed, or text that is parsed like CLI text)."""
    kind = kind_of(spec.type)
    if raw is None:
        if kind.optional:
            return None
        raise origin.fail("null", "needs a value", f"e.g. {origin.example(format_value(spec.default))}")
    if isinstance(raw, str):
        return parse_text(spec, raw, origin)
    if kind.is_tuple:
        items = raw if isinstance(raw, (list, tuple)) else [raw]
        return tuple(_coerce_scalar(spec, kind.base, item, origin) for item in items)
    if isinstance(raw, (list, tuple, dict)):
        raise origin.fail(
            str(raw),
            f"is not {_KIND_WORDS[kind.base]}",
            f"give one value, e.g. {origin.example(format_value(spec.default))}",
        )
    return _coerce_scalar(spec, kind.base, raw, origin)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def validate(spec: FieldSpec, value: Any, origin: Origin, text: str | None = None) -> Any:
    """Checks a typed value against the field's choices and bounds; returns it unchanged."""
    if value is None:
        return value
    shown = _shown(text if text is not None else format_value(value))
    items = value if isinstance(value, tuple) else (value,)
    arg = spec.arg
    for item in items:
        if arg.choices is not None and item not in arg.choices:
            raise _not_a_choice(shown, format_value(item), arg.choices, origin)
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            if arg.min is not None and item < arg.min:
                raise origin.fail(shown, f"is below the minimum {_num(arg.min)}", f"use at least {_num(arg.min)}")
            if arg.max is not None and item > arg.max:
                raise origin.fail(shown, f"is above the maximum {_num(arg.max)}", f"use at most {_num(arg.max)}")
    return value
