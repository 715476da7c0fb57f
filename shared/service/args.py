"""A service process's own options and identity, outside its role's config: the lifecycle flags (--ready-file,
--drain-timeout-s, --connect-timeout-s), `--resolved-config FILE` from `pdrelay up`, its default instance id and the
address it advertises."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.config.resolved import ResolvedConfig


@dataclass(frozen=True)
class ServiceOptions:
    """Process-level options that are not part of a role's config: how the parent talks to the process."""

    ready_file: str | None = None
    drain_timeout_s: float = 30.0
    connect_timeout_s: float = 5.0


def add_lifecycle_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("lifecycle")
    g.add_argument("--ready-file", default=None, help="write the ready JSON line to this file when ready")
    g.add_argument(
        "--drain-timeout-s",
        type=float,
        default=30.0,
        help="on SIGTERM, wait this long for in-flight work before stopping anyway",
    )
    g.add_argument(
        "--connect-timeout-s",
        type=float,
        default=5.0,
        help="give up starting when etcd or NATS do not answer within this many seconds",
    )


def split_lifecycle_args(argv: Sequence[str]) -> tuple[ServiceOptions, list[str]]:
    """Take the lifecycle flags out of argv; the rest goes to the role's config resolver."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_lifecycle_args(p)
    ns, rest = p.parse_known_args(list(argv))
    return options_from_namespace(ns), rest


RESOLVED_CONFIG_FLAG = "--resolved-config"


def service_args(role: str, argv: Sequence[str]) -> tuple[ResolvedConfig, ServiceOptions]:
    """(ResolvedConfig, ServiceOptions) of a service process.

    `--resolved-config FILE` (what `pdrelay up` passes: a ResolvedConfig JSON) replaces the role's flags; without
    it the remaining flags are resolved as usual (defaults < --config < PDRELAY_* env < flags). Bad input exits 2
    with the resolver's message (no traceback)."""
    from shared.config.resolve import exit_on_config_error, parse_role_args

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_lifecycle_args(p)
    p.add_argument(RESOLVED_CONFIG_FLAG, default=None)
    ns, rest = p.parse_known_args(list(argv))
    prog = f"pdrelay serve {role}"
    try:
        opts = options_from_namespace(ns)
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if ns.resolved_config is None:
        return parse_role_args(role, rest, prog=prog), opts
    if rest:
        print(
            f"{prog}: error: {RESOLVED_CONFIG_FLAG} replaces the service flags; drop {' '.join(rest)} "
            f"(or put them into the config that produced {ns.resolved_config})",
            file=sys.stderr,
        )
        raise SystemExit(2)
    with exit_on_config_error(prog):
        try:
            cfg = ResolvedConfig.from_json(Path(ns.resolved_config).read_text())
        except OSError as e:
            print(
                f"{prog}: error: cannot read {RESOLVED_CONFIG_FLAG} {ns.resolved_config}: {e.strerror}", file=sys.stderr
            )
            raise SystemExit(2) from None
    if cfg.role != role:
        print(
            f"{prog}: error: {ns.resolved_config} is a resolved config of role {cfg.role!r}, not {role!r}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return cfg, opts


def options_from_namespace(ns: argparse.Namespace) -> ServiceOptions:
    if ns.drain_timeout_s < 0:
        raise ValueError(f"--drain-timeout-s must be >= 0 (got {ns.drain_timeout_s}); try 30")
    if ns.connect_timeout_s <= 0:
        raise ValueError(f"--connect-timeout-s must be > 0 (got {ns.connect_timeout_s}); try 5")
    return ServiceOptions(
        ready_file=ns.ready_file, drain_timeout_s=ns.drain_timeout_s, connect_timeout_s=ns.connect_timeout_s
    )


def default_instance_id(role: str) -> str:
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40].strip("-_") or "host"
    return f"{role}-{host}-{os.getpid()}"


def advertised_host(bind_host: str) -> str:
    """What peers dial: the bind address, or this host's address when bound to all interfaces."""
    if bind_host in ("0.0.0.0", "::", ""):
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    return bind_host
