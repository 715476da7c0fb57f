"""bench/routing_scale.py in small: a run at 8 and 64 simulated instances finishes with sane numbers, and the KV
index stays within its bound when filled past it."""

from __future__ import annotations

import argparse

from bench.routing_scale import check_bound, measure_memory, run_one


def test_a_small_run_and_the_bound() -> None:
    args = argparse.Namespace(
        pages=64, requests=150, rate_per_instance=1.0, min_rate=200.0, pages_per_s=200, batches_per_s=20, seed=0
    )
    for n in (8, 64):
        mem = measure_memory(n, args.pages, args.seed)
        row = run_one(n, args, mem)
        assert row.requests > 100 and 0 < row.route_p50_us <= row.route_p99_us
        assert row.entries == n * args.pages and 40 < row.bytes_per_entry < 200, row
        assert row.prefix_hit > 0.3, row  # repeated documents mostly land where they are cached
    bound = check_bound(64, 64)
    assert bound["entries"] == bound["max_entries"] == 64 * 64 // 2 and bound["degraded_full"] > 0
