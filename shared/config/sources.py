"""Reading user settings for one role from its three sources: a YAML file, the environment, the command line.

Each reader returns typed, range-checked `Setting`s in the order they were given; resolve() layers them
(file < env < cli). Flags of groups the role does not use are rejected (CLI and file) or ignored (env: one
environment may be shared by every service, so a PDRELAY_API_KEY meant for the gateway must not stop a decode
worker from starting).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from shared.config import catalog
from shared.config.errors import ConfigError
from shared.config.fields import FieldSpec
from shared.config.groups import GROUPS
from shared.config.resolved import Provenance
from shared.config.values import (
    FALSE_WORDS,
    NONE_WORDS,
    TRUE_WORDS,
    Origin,
    coerce,
    format_value,
    kind_of,
    parse_text,
    validate,
)

CONFIG_FLAG = "--config"


@dataclass(frozen=True)
class Setting:
    """One value the user gave, already typed and checked against the field's choices and bounds."""

    spec: FieldSpec
    value: Any
    provenance: Provenance


# -- command line -------------------------------------------------------------------------------------------------
def _is_bool(spec: FieldSpec) -> bool:
    return kind_of(spec.type).base is bool and not kind_of(spec.type).is_tuple


def _lookup_flag(role: str, flag: str) -> tuple[FieldSpec, bool]:
    """(spec, negated) for a flag spelling, or a ConfigError: foreign to the role, or unknown (with a suggestion)."""
    table = catalog.flag_table()
    spec, negated = table.get(flag), False
    if spec is None and flag.startswith("--no-"):
        candidate = table.get("--" + flag[5:])
        if candidate is not None and _is_bool(candidate):
            spec, negated = candidate, True
    if spec is None:
        hint = catalog.suggest(flag, catalog.role_spellings(role))
        raise ConfigError(f"unknown flag {flag} for role {role!r}{hint or '; run with --help to list its flags'}")
    if not catalog.role_uses(role, spec.group):
        raise catalog.foreign_flag_error(role, spec, flag)
    return spec, negated


def read_argv(role: str, argv: Sequence[str]) -> tuple[str | None, list[Setting]]:
    """(the --config file or None, settings in command-line order).

    Forms: `--flag value`, `--flag=value`; booleans `--flag`, `--no-flag`, `--flag true|false`; optional fields
    take `none`; tuples take a comma list and may be repeated (`--etcd a --etcd b` -> (a, b)).
    """
    config_file: str | None = None
    settings: list[Setting] = []
    tuples: dict[str, tuple[Any, ...]] = {}  # repeated tuple flags accumulate
    args = list(argv)
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--") or token == "--":
            after = f" (after {args[i - 2]})" if i >= 2 else ""
            raise ConfigError(f"unexpected argument {token!r}{after}; flags look like --page-size 16")
        flag, eq, inline = token.partition("=")
        if flag == CONFIG_FLAG:
            if config_file is not None:
                raise ConfigError(f"{CONFIG_FLAG} given twice ({config_file!r} and more); merge the files into one")
            if not eq:
                if i >= len(args):
                    raise ConfigError(f"{CONFIG_FLAG} needs a file; e.g. {CONFIG_FLAG} decode.yaml")
                inline, i = args[i], i + 1
            config_file = inline
            continue
        spec, negated = _lookup_flag(role, flag)
        origin = Origin("cli", flag)
        kind = kind_of(spec.type)
        if negated:
            if eq:
                raise ConfigError(f"{token} takes no value; write {flag} or --{flag[5:]} {inline}")
            text = "false"
        elif eq:
            text = inline
        elif _is_bool(spec):
            # `--flag` alone means true; a following true/false (or none, for optional ones) is its value.
            words = TRUE_WORDS | FALSE_WORDS | (NONE_WORDS - {""} if kind.optional else frozenset())
            if i < len(args) and args[i].lower() in words:
                text, i = args[i], i + 1
            else:
                text = "true"
        else:
            if i >= len(args) or args[i].startswith("--"):
                raise ConfigError(f"{flag} needs a value; e.g. {flag} {_example(spec)}")
            text, i = args[i], i + 1
        value = validate(spec, parse_text(spec, text, origin), origin, text)
        if kind.is_tuple and value is not None:
            value = tuples[spec.key] = tuples.get(spec.key, ()) + value
        settings.append(Setting(spec, value, Provenance("cli", flag)))
    return config_file, settings


def _example(spec: FieldSpec) -> str:
    if spec.arg.choices:
        return format_value(spec.arg.choices[0])
    return format_value(spec.default) if spec.default not in (None, (), "") else "VALUE"


# -- environment ----------------------------------------------------------------------------------------------------
def read_env(role: str, env: Mapping[str, str]) -> list[Setting]:
    """Settings from PDRELAY_<FIELD> twins of the flags this role accepts; every other variable is ignored."""
    settings = []
    for spec in catalog.role_specs(role):
        text = env.get(spec.env)
        if text is None:
            continue
        origin = Origin("env", spec.env)
        value = validate(spec, parse_text(spec, text, origin), origin, text)
        settings.append(Setting(spec, value, Provenance("env", spec.env)))
    return settings


# -- YAML file ------------------------------------------------------------------------------------------------------
def _file_items(data: dict[Any, Any]) -> list[tuple[str, Any, str | None]]:
    """(key, raw value, group section or None).

    A group name holding a mapping is a section (`cache: {page_size: 16}`); `model: /path` stays the field.
    """
    items: list[tuple[str, Any, str | None]] = []
    for key, raw in data.items():
        key = str(key)
        if key in GROUPS and isinstance(raw, dict):
            items += [(str(k), v, key) for k, v in raw.items()]
        else:
            items.append((key, raw, None))
    return items


def read_file(role: str, path: str) -> list[Setting]:
    """Settings from a YAML mapping whose keys are field names (page_size) or flag names (page-size, --page-size).

    Keys for other roles are rejected like their flags: a file names one role's settings.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"{CONFIG_FLAG} {path}: no such file; check the path")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{CONFIG_FLAG} {path} is not valid YAML ({e}); fix the file") from None
    except OSError as e:
        raise ConfigError(f"{CONFIG_FLAG} {path} cannot be read ({e.strerror}); check its permissions") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ConfigError(
            f"{CONFIG_FLAG} {path} must hold a mapping of settings (page_size: 16), not a {type(data).__name__}"
        )
    settings = []
    for key, raw, section in _file_items(data):
        spec = catalog.spec_for_file_key(key)
        if spec is None:
            names = [s.name for s in catalog.role_specs(role)]
            hint = catalog.suggest(key.lstrip("-").replace("-", "_"), names)
            raise ConfigError(f"unknown key {key!r} in {path} for role {role!r}{hint or '; see pdrelay config show'}")
        if section is not None and spec.group != section:
            raise ConfigError(
                f"{key!r} in {path} sits under {section!r} but belongs to {spec.group!r}; "
                f"move it there or to the top level"
            )
        if not catalog.role_uses(role, spec.group):
            raise catalog.foreign_flag_error(role, spec, f"{key!r} in {path}")
        origin = Origin("file", key, path)
        value = validate(spec, coerce(spec, raw, origin), origin)
        settings.append(Setting(spec, value, Provenance("file", path)))
    return settings
