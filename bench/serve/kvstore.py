"""`pdrelay bench serve --compare-kvstore`: the same seeded workload against two fresh local clusters, one with a
kvstore and one without, and the TTFT ratio with the store's hit rate.

    pdrelay bench serve --compare-kvstore --dataset multi-turn --multi-turn-turns 4 --num-prompts 32 \\
        --random-input-len 96 --random-output-len 32 --max-concurrency 2 --prefill-num-pages 24 --decode-num-pages 48

Both clusters: 1 gateway (kv_aware), 1 prefill, 1 decode (`pdrelay up` machinery, free ports, --threads 1); the
first also runs one kvstore. Small pools (--prefill-num-pages / --decode-num-pages) make the conversations' history
exceed what the engines keep, which is where the store pays. Reported: mean / p90 TTFT of each side and their
ratio, the prefill prefix hit rate (prompt tokens not computed: from the local cache or loaded from the store),
the store's hit rate (pages found / pages looked up) and the share of prompt tokens loaded from it, next to the
workload's maximum reuse (every earlier turn of the conversation held somewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.serve.datasets import BenchRequest, BenchTokenizer
from bench.serve.metrics import Slo
from bench.serve.policies import READY_TIMEOUT_S, _log, _measure, detached_cluster, scrape_counters, workload_line
from bench.serve.report import format_table

STORE_COUNTERS = ("pdrelay:kvstore_lookup_pages", "pdrelay:kvstore_hit_pages", "pdrelay:kvstore_get_pages")
SIDES = ("kvstore", "no-kvstore")


def add_kvstore_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kvstore comparison (one local cluster with a kvstore, one without)")
    g.add_argument(
        "--compare-kvstore",
        action="store_true",
        help="run the workload on a fresh cluster with a kvstore and on one without; print TTFT ratios "
        "and the store's hit rate",
    )
    g.add_argument(
        "--decode-num-pages",
        type=int,
        default=0,
        metavar="N",
        help="--compare-kvstore: KV pages of the decode instance (0: derived)",
    )


def _up_options(side: str, ns: argparse.Namespace, model: str, run_dir: Path):  # -> UpOptions
    import shlex

    from shared.cluster.localcluster.plan import UpOptions
    from shared.cluster.localcluster.servers import free_port

    role_extra: dict[str, tuple[str, ...]] = {}
    if ns.prefill_num_pages:
        role_extra["prefill"] = ("--num-pages", str(ns.prefill_num_pages))
    if ns.decode_num_pages:
        role_extra["decode"] = ("--num-pages", str(ns.decode_num_pages))
    extra = (
        "--model",
        model,
        "--threads",
        "1",
        "--routing-policy",
        "kv_aware",
        "--port",
        str(free_port()),
        *shlex.split(ns.cluster_flags),
    )
    counts = {"gateway": 1, "prefill": 1, "decode": 1, "kvstore": 1 if side == "kvstore" else 0}
    return UpOptions(
        run_dir=str(run_dir),
        cluster=f"bench-{side}",
        etcd_port=free_port(),
        nats_port=free_port(),
        counts=counts,
        extra=extra,
        role_extra=role_extra,
        ready_timeout_s=READY_TIMEOUT_S,
        echo_log=False,
    )


def max_reuse(requests: list[BenchRequest], output_len: int) -> float:
    """Share of prompt tokens a perfect cache could serve: each turn's whole earlier conversation (earlier user
    turns and answers; chat-template tokens ignored)."""
    total = reusable = 0
    by_conv: dict[int, int] = {}
    for r in sorted(requests, key=lambda r: (r.conversation or 0, r.turn or 0)):
        history = by_conv.get(r.conversation or 0, 0)
        total += history + r.prompt_len
        reusable += history
        by_conv[r.conversation or 0] = history + r.prompt_len + output_len
    return reusable / total if total else 0.0


def _run_side(
    side: str,
    ns: argparse.Namespace,
    model: str,
    requests: list[BenchRequest],
    tok: BenchTokenizer,
    slo: Slo | None,
    percentiles: tuple[float, ...],
    tmp: Path,
    deadline: float,
) -> dict[str, Any]:
    run_dir = tmp / side
    with detached_cluster(side, _up_options(side, ns, model, run_dir), run_dir) as (url, ready):
        metrics = {
            iid: (role, info.metrics)
            for iid, (role, info) in ready.items()
            if role in ("prefill", "kvstore") and info is not None and info.metrics
        }
        prefills = {iid: addr for iid, (role, addr) in metrics.items() if role == "prefill"}
        stores = {iid: addr for iid, (role, addr) in metrics.items() if role == "kvstore"}
        before = {iid: scrape_counters(a, STORE_COUNTERS) for iid, a in stores.items()}
        summary = asyncio.run(_measure(url, requests, ns, tok, prefills, slo, percentiles, deadline))
        after = {iid: scrape_counters(a, STORE_COUNTERS) for iid, a in stores.items()}
    delta = {k: sum(after[i][k] - before[i][k] for i in after) for k in STORE_COUNTERS}
    looked, hit = delta["pdrelay:kvstore_lookup_pages"], delta["pdrelay:kvstore_hit_pages"]
    summary["label"] = side
    summary["store_lookup_pages"] = looked
    summary["store_hit_pages"] = hit
    summary["store_loaded_pages"] = delta["pdrelay:kvstore_get_pages"]
    summary["store_hit_rate"] = hit / looked if looked else 0.0
    _log(
        f"{side}: mean TTFT {summary['mean_ttft_ms']:.0f} ms, prefix hit rate "
        f"{summary['prefill_prefix_hit_rate']:.1%}, store hit rate {summary['store_hit_rate']:.1%}"
    )
    return summary


def run_kvstore_comparison(
    ns: argparse.Namespace,
    requests: list[BenchRequest],
    tok: BenchTokenizer,
    tokenizer_dir: Path,
    settings: dict[str, Any],
    slo: Slo | None,
    percentiles: tuple[float, ...],
) -> int:
    if ns.base_url or ns.mock_workers or ns.compare_url or ns.compare_policies:
        raise ValueError(
            "--compare-kvstore starts its own clusters; drop --base-url / --mock-workers / "
            "--compare-url / --compare-policies"
        )
    if "p90" not in [f"p{p:g}" for p in percentiles]:
        percentiles = tuple(sorted({*percentiles, 90.0}))
    deadline = time.monotonic() + ns.total_timeout_s
    with tempfile.TemporaryDirectory(prefix="pdrelay-bench-kvstore-") as tmp:
        sides = [
            _run_side(s, ns, str(tokenizer_dir), requests, tok, slo, percentiles, Path(tmp), deadline) for s in SIDES
        ]
    with_store, without = sides
    reuse = max_reuse(requests, ns.random_output_len)
    partial = any(s["partial"] for s in sides)
    print(
        f"Topology (each side): 1 gateway (kv_aware), 1 prefill ({ns.prefill_num_pages or 'derived'} KV pages), "
        f"1 decode ({ns.decode_num_pages or 'derived'} KV pages), --threads 1; first side + 1 kvstore"
    )
    print(f"Workload: {workload_line(ns)}; fresh cluster per side, in this order: {', '.join(SIDES)}")
    print(
        format_table(
            "kvstore vs none (same workload, one run)" + (" (partial)" if partial else ""),
            with_store,
            percentiles,
            compare=without,
            labels=SIDES,
        )
    )
    ratios = {
        k: without[k] / with_store[k] if with_store.get(k) else None
        for k in ("mean_ttft_ms", "p90_ttft_ms", "median_ttft_ms")
    }
    print(
        "TTFT without / with the kvstore: "
        + ", ".join(f"{k.removesuffix('_ttft_ms')} {v:.2f}x" if v else f"{k} n/a" for k, v in ratios.items())
    )
    print(
        f"prefill prefix hit rate: with {with_store['prefill_prefix_hit_rate']:.1%}, without "
        f"{without['prefill_prefix_hit_rate']:.1%}; workload maximum {reuse:.1%}"
    )
    print(
        f"store: {with_store['store_hit_pages']:.0f} of {with_store['store_lookup_pages']:.0f} looked-up pages "
        f"held ({with_store['store_hit_rate']:.1%}), {with_store['store_loaded_pages']:.0f} pages loaded"
    )
    if ns.output_json:
        doc = {
            **settings,
            "sides": sides,
            "ttft_ratios_without_over_with": ratios,
            "max_reuse": reuse,
            "partial": partial,
        }
        Path(ns.output_json).write_text(json.dumps(doc, indent=2) + "\n")
        _log(f"wrote {ns.output_json}")
    return 1 if partial or any(s["completed"] != len(requests) for s in sides) else 0
