"""`pdrelay bench control-plane`: discovery, bus and gRPC latencies next to raw etcd/NATS/gRPC (bench/control_plane.py)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "control-plane",
        help="etcd/NATS/gRPC control-plane latencies",
        add_help=False,
        description="All flags go to bench/control_plane.py (see --help).",
    )
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    from bench.control_plane import main
    from shared.cluster.errors import ControlPlaneUnavailable

    try:
        return int(main(list(extra)) or 0)
    except ControlPlaneUnavailable as e:  # --etcd / --nats given but not answering: one line, no traceback
        print(f"pdrelay bench control-plane: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a malformed --etcd / --nats URL
        print(f"pdrelay bench control-plane: {e}", file=sys.stderr)
        return 2
