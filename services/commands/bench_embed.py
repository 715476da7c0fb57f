"""`pdrelay bench embed`: /v1/embeddings (gateway -> encoder, dynamic batching) vs sentence-transformers `encode`
per request, at several concurrency levels in one run (bench/embed.py)."""

from __future__ import annotations

import argparse
import sys

from bench.embed import add_arguments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="embeddings throughput vs sentence-transformers encode per request",
        description="Start etcd, NATS, a gateway and an encoder on the bundled all-MiniLM-L6-v2; send one sentence "
        "per request at each concurrency level, alternating with sentence-transformers encode() per request in "
        "this process (same sentences, same torch threads); print requests/s, p50/p99 latency and the ratio.",
    )
    add_arguments(p)
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"pdrelay bench embed: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    from bench.embed import run as run_bench

    return run_bench(ns)
