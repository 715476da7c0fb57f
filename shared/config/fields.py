"""Field metadata: every option is declared once, as ``name: A[T, Arg(...)] = default``.

The CLI flag (``--page-size``) and the environment twin (``PDRELAY_PAGE_SIZE``) are derived from the field name,
so a flag can never drift from the field it sets. Choices and bounds live on the field as data.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Annotated, Any

# An import alias (not `A = Annotated`): type checkers treat only the import as the Annotated special form.
from typing import Annotated as A

__all__ = ["ENV_PREFIX", "A", "Arg", "FieldSpec", "env_name", "field_specs", "flag_name"]

ENV_PREFIX = "PDRELAY_"


@dataclass(frozen=True)
class Arg:
    """What the CLI, the env twin, validation and `config show` need to know about one field."""

    help: str
    choices: tuple[Any, ...] | None = None
    min: float | None = None  # inclusive lower bound for numbers
    max: float | None = None  # inclusive upper bound for numbers
    aliases: tuple[str, ...] = ()  # extra CLI spellings, e.g. ("--model-path",)
    secret: bool = False  # redacted in `config show` and logs


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


@dataclass(frozen=True)
class FieldSpec:
    """One declared option, read off a group dataclass."""

    group: str  # attribute name of the group on the resolved config, e.g. "cache"
    name: str  # field name, e.g. "page_size"
    type: Any  # the bare type (Annotated stripped), e.g. int, str | None, tuple[int, ...]
    arg: Arg
    default: Any

    @property
    def flag(self) -> str:
        return flag_name(self.name)

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def key(self) -> str:
        return f"{self.group}.{self.name}"


def field_specs(group_name: str, cls: type) -> list[FieldSpec]:
    """The options a group dataclass declares, in declaration order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    specs = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        assert typing.get_origin(hint) is Annotated, f"{cls.__name__}.{f.name} must be declared as A[T, Arg(...)]"
        bare, *meta = typing.get_args(hint)
        arg = next((m for m in meta if isinstance(m, Arg)), None)
        assert arg is not None, f"{cls.__name__}.{f.name} lacks an Arg(...)"
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise AssertionError(f"{cls.__name__}.{f.name} needs a default")
        choice_set = _enum_of(bare)
        if choice_set is not None and arg.choices is None:  # an enum-typed field chooses from its members
            arg = dataclasses.replace(arg, choices=tuple(choice_set))
        specs.append(FieldSpec(group_name, f.name, bare, arg, default))
    return specs


def _enum_of(tp: Any) -> type[enum.StrEnum] | None:
    """The StrEnum a field's type is (or `E | None` names), else None."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and issubclass(t, enum.StrEnum):
            return t
    return None
