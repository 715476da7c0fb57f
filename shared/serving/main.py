"""The few lines every service `__main__` shares: config (flags or `--resolved-config`), logging, run."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from shared.cluster.lifecycle import ServiceOptions, run_service, service_args


def setup_logging(cfg: Any) -> None:
    logging.basicConfig(level=cfg.telemetry.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve_role(role: str, factory: Callable[[Any, ServiceOptions], Any], argv: Sequence[str] | None) -> int:
    cfg, opts = service_args(role, list(sys.argv[1:] if argv is None else argv))
    setup_logging(cfg)
    try:
        svc = factory(cfg, opts)
    except ValueError as e:
        print(f"pdrelay {role}: error: {e}", file=sys.stderr)
        return 2
    return run_service(svc)
