"""`pdrelay bench transfer`: KV transfer GB/s per backend between two processes, next to memcpy (bench/transfer.py)."""

from __future__ import annotations

import argparse
import sys

from bench.transfer import add_arguments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "transfer",
        help="KV transfer GB/s vs memcpy",
        description="Write batches of KV pages (64 KiB to 64 MiB) from this process into a reader process with "
        "each transfer backend; print the descriptors each batch becomes and GB/s next to a memcpy of the same "
        "bytes, with the ratios. --layout allocator (default) places the pages as the engine's allocator does "
        "after a churn of requests; scattered and contiguous give the worst and best cases.",
    )
    add_arguments(p)
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"pdrelay bench transfer: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    from bench.transfer import run as run_bench

    return run_bench(ns)
