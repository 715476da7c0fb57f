"""`pdrelay bench control-plane`: discovery, bus and gRPC latencies next to raw etcd/NATS/gRPC (bench/control_plane.py)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("control-plane", help="etcd/NATS/gRPC control-plane latencies", add_help=False,
                       description="All flags go to bench/control_plane.py (see --help).")
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    from bench.control_plane import main

    return int(main(list(extra)) or 0)
