"""The few lines every service `__main__` shares: config (flags or `--resolved-config`), logging, run."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from shared.config.resolved import ResolvedConfig
from shared.service import Service, ServiceOptions, default_instance_id, run_service, service_args
from shared.telemetry.logs import setup_logging as setup_service_logging


def setup_logging(cfg: ResolvedConfig) -> None:
    """Text lines, or JSON with trace and request ids (--log-json): shared.telemetry.logs."""
    role = cfg.role
    setup_service_logging(cfg.telemetry, role=role, instance_id=cfg.discovery.instance_id or default_instance_id(role))


def serve_role(
    role: str, factory: Callable[[ResolvedConfig, ServiceOptions], Service], argv: Sequence[str] | None
) -> int:
    cfg, opts = service_args(role, list(sys.argv[1:] if argv is None else argv))
    setup_logging(cfg)
    try:
        svc = factory(cfg, opts)
    except ValueError as e:
        print(f"pdrelay {role}: error: {e}", file=sys.stderr)
        return 2
    return run_service(svc)
