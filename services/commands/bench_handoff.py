"""`pdrelay bench handoff`: TTFT disaggregated (prefill + decode, KV over NIXL/Mooncake) vs colocated
(bench/disagg.py)."""

from __future__ import annotations

import argparse
import sys

from bench.disagg import add_arguments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "handoff",
        help="disaggregated vs colocated TTFT (KV hand-off overhead)",
        description="Start etcd, NATS, a colocated worker and a prefill + decode pair per transfer backend; send "
        "prompts of 256/1024/2048 random tokens with max_tokens=1 to each in interleaved rounds; print TTFT of "
        "both, the hand-off overhead (TTFT_disagg - TTFT_colocated) and the KV transfer time as fractions of TTFT.",
    )
    add_arguments(p)
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"pdrelay bench handoff: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    from bench.disagg import run as run_bench

    return run_bench(ns)
