"""The few lines every service `__main__` shares: lifecycle flags, role config, logging, run."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shared.cluster.lifecycle import ServiceOptions, run_service, split_lifecycle_args
from shared.config import ResolvedConfig, parse_role_args


def load_role_config(role: str, argv: Sequence[str]) -> ResolvedConfig:
    """`--resolved-config FILE` (JSON written by `pdrelay up`) or ordinary flags/env/YAML for the role."""
    argv = list(argv)
    if "--resolved-config" in argv:
        i = argv.index("--resolved-config")
        if i + 1 >= len(argv):
            print(f"pdrelay {role}: error: --resolved-config needs a file path", file=sys.stderr)
            raise SystemExit(2)
        path = argv[i + 1]
        rest = argv[:i] + argv[i + 2:]
        if rest:
            print(f"pdrelay {role}: error: --resolved-config cannot be combined with other flags: "
                  f"{' '.join(rest)}", file=sys.stderr)
            raise SystemExit(2)
        try:
            with open(path, encoding="utf-8") as f:
                cfg = ResolvedConfig.from_json(f.read())
        except (OSError, ValueError) as e:
            print(f"pdrelay {role}: error: --resolved-config {path}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        if cfg.role != role:
            print(f"pdrelay {role}: error: --resolved-config {path} is for role '{cfg.role}'", file=sys.stderr)
            raise SystemExit(2)
        return cfg
    return parse_role_args(role, argv, os.environ, prog=f"pdrelay serve {role}")


def setup_logging(cfg: Any) -> None:
    level = cfg.telemetry.log_level.upper()
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve_role(role: str, factory: Callable[[Any, ServiceOptions], Any], argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts, rest = split_lifecycle_args(argv)
    except ValueError as e:
        print(f"pdrelay {role}: error: {e}", file=sys.stderr)
        return 2
    cfg = load_role_config(role, rest)
    setup_logging(cfg)
    try:
        svc = factory(cfg, opts)
    except ValueError as e:
        print(f"pdrelay {role}: error: {e}", file=sys.stderr)
        return 2
    return run_service(svc)
