"""`pdrelay bench engine`: engine output tok/s vs HF generate in static batches, with a roofline (bench/engine.py)."""

from __future__ import annotations

import argparse
import sys

from bench.engine import add_arguments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "engine",
        help="engine throughput vs HF generate",
        description="Run uniform (128/64 at concurrency 1/8/16/32) and varied (64 requests, prompts 32-512, "
        "outputs 16-256, concurrency 16) greedy workloads through the engine and through HF generate in static "
        "batches; print tok/s, ratios, step latency, scheduler share and the fraction of the machine's roofline.",
    )
    add_arguments(p)
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"pdrelay bench engine: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    from bench.engine import run as run_bench

    return run_bench(ns)
