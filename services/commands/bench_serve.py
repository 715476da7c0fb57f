"""`pdrelay bench serve`: TTFT/TPOT/ITL/E2E, throughput and goodput against an OpenAI-compatible endpoint
(bench/serve/main.py), optionally side by side with a second endpoint or against the gateway over mock workers."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    from bench.serve.main import add_arguments

    p = sub.add_parser(
        "serve",
        help="serving benchmark against an OpenAI-compatible endpoint",
        description="Stream requests (random, shared-prefix or multi-turn prompts; Poisson arrivals; a concurrency "
        "cap) to /v1/completions or /v1/chat/completions of pdrelay's gateway, vLLM, sglang-router or a Dynamo "
        "frontend; print TTFT, TPOT, ITL, E2E, throughput and goodput with vLLM's keys. --mock-workers measures "
        "pdrelay's gateway over mock workers (with its CPU per request); --compare-url adds a second endpoint "
        "and the ratios; --compare-policies starts one local cluster per gateway routing policy, back to back, and "
        "prints their TTFT ratios and prefix hit rates.",
    )
    add_arguments(p)
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"pdrelay bench serve: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    from bench.serve.main import run as run_bench

    return run_bench(ns)
