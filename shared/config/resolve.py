"""resolve(): defaults < YAML file (--config) < env (PDRELAY_*) < command line < derived values (passes)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shared.config import catalog
from shared.config.errors import ConfigError
from shared.config.groups import GROUPS
from shared.config.passes import PassContext, run_passes
from shared.config.probe import probe_from_env
from shared.config.resolved import Provenance, ResolvedConfig
from shared.config.roles import ROLE_GROUPS, Role
from shared.config.sources import read_argv, read_env, read_file
from shared.config.values import format_value, kind_of


def defaults(role: str) -> ResolvedConfig:
    """The role's config with every field at its declared default (before any source or pass)."""
    catalog.check_role(role)
    by_group = {g: GROUPS[g]() for g in ROLE_GROUPS[role]}
    provenance = {s.key: Provenance("default") for s in catalog.role_specs(role)}
    return ResolvedConfig(Role(role), by_group, provenance)


def resolve(
    role: str, argv: Sequence[str] = (), env: Mapping[str, str] | None = None, *, ctx: PassContext | None = None
) -> ResolvedConfig:
    """The resolved config of `role` from command-line flags `argv` (incl. `--config FILE`) and `env`
    (os.environ when None). Raises ConfigError with a message that names the flag, the value and the fix."""
    catalog.check_role(role)
    env = os.environ if env is None else env
    config_file, cli = read_argv(role, argv)  # first: it names the file
    layers = [read_file(role, config_file) if config_file is not None else [], read_env(role, env), cli]
    values: dict[str, dict[str, Any]] = {g: {} for g in ROLE_GROUPS[role]}
    provenance = {s.key: Provenance("default") for s in catalog.role_specs(role)}
    for layer in layers:  # lowest precedence first: later layers overwrite
        for setting in layer:
            values[setting.spec.group][setting.spec.name] = setting.value
            provenance[setting.spec.key] = setting.provenance
    by_group = {g: GROUPS[g](**kw) for g, kw in values.items()}
    return run_passes(ResolvedConfig(Role(role), by_group, provenance), ctx or PassContext(probe=probe_from_env(env)))


@contextlib.contextmanager
def exit_on_config_error(prog: str = "pdrelay") -> Iterator[None]:
    """For CLI entry points: a ConfigError becomes `<prog>: error: <message>` on stderr and exit code 2."""
    try:
        yield
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def parse_role_args(
    role: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    prog: str | None = None,
    ctx: PassContext | None = None,
) -> ResolvedConfig:
    """What a service's main calls: -h/--help prints the role's flags and exits 0; bad input exits 2 with the
    message and no traceback; otherwise the resolved config."""
    prog = prog or f"pdrelay serve {role}"
    if "-h" in argv or "--help" in argv:
        print(role_help(role, prog))
        raise SystemExit(0)
    with exit_on_config_error(prog):
        return resolve(role, argv, env, ctx=ctx)
    raise AssertionError("unreachable")  # for type checkers: the context manager either returns or exits


def role_help(role: str, prog: str | None = None) -> str:
    """The flags a role accepts, grouped, with help text, default, choices and env twin."""
    catalog.check_role(role)
    lines = [
        f"usage: {prog or 'pdrelay serve ' + role} [--config FILE] [flags]",
        "",
        "Sources, lowest to highest: defaults < --config FILE (YAML) < PDRELAY_* env < flags < derived.",
        "",
    ]
    for group in ROLE_GROUPS[role]:
        lines.append(f"{group}:")
        for spec in catalog.group_specs(group):
            kind = kind_of(spec.type)
            metavar = "" if kind.base is bool and not kind.is_tuple else (" A,B,..." if kind.is_tuple else " VALUE")
            names = ", ".join((spec.flag + metavar, *spec.arg.aliases))
            extra = f" choices: {', '.join(map(format_value, spec.arg.choices))};" if spec.arg.choices else ""
            lines.append(f"  {names}")
            lines.append(f"      {spec.arg.help} (default: {format_value(spec.default)};{extra} env {spec.env})")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
