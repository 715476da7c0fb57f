"""`pdrelay serve <role> [flags]`: run one service in the foreground (same as `python -m services.<role>`)."""

from __future__ import annotations

import argparse
import importlib
import sys

from shared.config.roles import ROLES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run one service in the foreground: pdrelay serve <role> [flags]",
        description="Run one service; every flag after the role goes to that role's config.",
    )
    p.add_argument("role", choices=ROLES, help="which service to run")
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    try:
        mod = importlib.import_module(f"services.{ns.role}.__main__")
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith(f"services.{ns.role}"):
            raise
        print(f"pdrelay serve: the '{ns.role}' service is not available in this build", file=sys.stderr)
        return 2
    return int(mod.main(extra) or 0)
