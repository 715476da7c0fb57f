"""`pdrelay bench trace`: serving throughput with tracing off vs on (sampled 100%) in one run (bench/trace_overhead.py)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace",
        help="tracing overhead: throughput with tracing off vs on",
        add_help=False,
        description="All flags go to bench/trace_overhead.py (see --help).",
    )
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    from bench.trace_overhead import main

    return int(main(list(extra)) or 0)
