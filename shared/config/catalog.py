"""Lookup tables over the declared options: by field name, CLI flag, alias and file key; which roles accept what."""

from __future__ import annotations

import difflib
import functools

from shared.config.errors import ConfigError
from shared.config.fields import FieldSpec, field_specs
from shared.config.groups import GROUPS
from shared.config.roles import ROLE_GROUPS, ROLES


@functools.cache
def all_specs() -> tuple[FieldSpec, ...]:
    """Every option of every group, in `config show` order. Field names and flags are unique across groups."""
    specs = tuple(s for name, cls in GROUPS.items() for s in field_specs(name, cls))
    names = [s.name for s in specs]
    assert len(names) == len(set(names)), f"duplicate field names across groups: {names}"
    spellings = [f for s in specs for f in (s.flag, *s.arg.aliases)]
    assert len(spellings) == len(set(spellings)), f"duplicate flags or aliases: {spellings}"
    return specs


@functools.cache
def specs_by_name() -> dict[str, FieldSpec]:
    return {s.name: s for s in all_specs()}


@functools.cache
def specs_by_key() -> dict[str, FieldSpec]:
    """'group.field' -> spec (the key of provenance and of the JSON form)."""
    return {s.key: s for s in all_specs()}


def group_specs(group: str) -> tuple[FieldSpec, ...]:
    return tuple(s for s in all_specs() if s.group == group)


@functools.cache
def flag_table() -> dict[str, FieldSpec]:
    """Every CLI spelling ('--page-size', aliases such as '--model-path') -> spec."""
    return {f: s for s in all_specs() for f in (s.flag, *s.arg.aliases)}


def spec_for_file_key(key: str) -> FieldSpec | None:
    """A config-file key may be a field name (page_size), a flag name (page-size, --page-size) or an alias."""
    spelled = "--" + key.lstrip("-").replace("_", "-")
    return flag_table().get(spelled)


def check_role(role: str) -> None:
    if role not in ROLE_GROUPS:
        close = difflib.get_close_matches(role, ROLES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown role {role!r}; choose one of: {', '.join(ROLES)}{hint}")


def role_uses(role: str, group: str) -> bool:
    return group in ROLE_GROUPS[role]


def roles_using(group: str) -> tuple[str, ...]:
    return tuple(r for r, groups in ROLE_GROUPS.items() if group in groups)


def role_specs(role: str) -> tuple[FieldSpec, ...]:
    return tuple(s for s in all_specs() if role_uses(role, s.group))


def role_spellings(role: str) -> list[str]:
    """Every flag the role accepts, incl. aliases and the `--no-` form of booleans (for suggestions)."""
    out = []
    for s in role_specs(role):
        out += [s.flag, *s.arg.aliases]
        if s.type is bool or s.type == (bool | None):
            out.append("--no-" + s.flag[2:])
    return out


def foreign_flag_error(role: str, spec: FieldSpec, shown: str) -> ConfigError:
    """`--api-key is not accepted by role 'decode'; roles that accept it: gateway`."""
    return ConfigError(
        f"{shown} is not accepted by role {role!r}; roles that accept it: {', '.join(roles_using(spec.group))}"
    )


def suggest(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
