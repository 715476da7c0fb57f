"""`pdrelay bench serve --compare-policies kv_aware,round_robin`: the same seeded workload against one local
cluster per gateway routing policy, started back to back (`pdrelay up` machinery: etcd, NATS, a gateway, prefill
and decode instances on free ports), and the TTFT ratio with each policy's prefix-cache hit rate.

    pdrelay bench serve --compare-policies kv_aware,round_robin \\
        --dataset shared-prefix --shared-prefix-groups 8 --num-prompts 48 --random-input-len 32 \\
        --random-output-len 8 --max-concurrency 2 --prefill-instances 2 --decode-instances 2 --prefill-num-pages 160

Each cluster gets a fresh etcd, NATS and engines (cold prefix caches), a few warm-up requests with prompts that
share nothing with the measured ones (so every prefix hit in the measured run is the routing's doing), then the
measured run. The hit rate is what the prefill instances' own counters say over the measured run
(pdrelay:prefix_cache_hits / pdrelay:prefix_cache_queries, prompt tokens): the share of prompt tokens prefill
did not have to compute. `--prefill-num-pages` gives prefill instances a small KV pool so that their caches
compete (more system prompts than one instance holds), which is where a router's choice shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.serve.client import RequestOptions, served_model
from bench.serve.datasets import BenchRequest, BenchTokenizer, random_dataset
from bench.serve.http_client import make_http
from bench.serve.metrics import Slo, compute_metrics
from bench.serve.report import format_table
from bench.serve.runner import Workload, run_workload, warm_up

READY_TIMEOUT_S = 240.0
WARMUP_INPUT_LEN = 48  # warm-up prompts: short, random, no prefix shared with the measured requests


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("routing policies (one local cluster per policy)")
    g.add_argument(
        "--compare-policies",
        default=None,
        metavar="P1,P2",
        help="start a local cluster per gateway --routing-policy (e.g. kv_aware,round_robin), back to "
        "back, run the same workload on each, print the TTFT ratios and prefix hit rates",
    )
    g.add_argument("--prefill-instances", type=int, default=2, help="prefill instances per cluster (default 2)")
    g.add_argument("--decode-instances", type=int, default=2, help="decode instances per cluster (default 2)")
    g.add_argument(
        "--prefill-num-pages",
        type=int,
        default=0,
        metavar="N",
        help="KV pages of each prefill instance (0: derived from memory); small pools make the "
        "instances' prefix caches compete",
    )
    g.add_argument(
        "--cluster-flags",
        default="",
        metavar="FLAGS",
        help="more service flags for every instance, e.g. '--transfer-backend mooncake'",
    )


def parse_policies(text: str) -> tuple[str, ...]:
    """'kv_aware,round_robin' -> ('kv_aware', 'round_robin'); ValueError naming what is wrong."""
    from shared.config.catalog import specs_by_name

    # the gateway's --routing-policy choices, declared once with the flag
    policies = tuple(str(c) for c in specs_by_name()["routing_policy"].arg.choices or ())

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in policies]
    if bad:
        raise ValueError(
            f"--compare-policies: {', '.join(bad)} is not a routing policy; use some of {', '.join(policies)}"
        )
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(
            f"--compare-policies {text!r}: name at least two different policies, e.g. kv_aware,round_robin"
        )
    return names


def validate(ns: argparse.Namespace) -> tuple[str, ...]:
    """The policies to compare; ValueError for flags that do not go with --compare-policies."""
    policies = parse_policies(ns.compare_policies)
    clash = [
        flag
        for flag, given in (
            ("--base-url", ns.base_url),
            ("--mock-workers", ns.mock_workers),
            ("--compare-url", ns.compare_url),
            ("--peer-cmd", getattr(ns, "peer_cmd", None)),
        )
        if given
    ]
    if clash:
        raise ValueError(f"--compare-policies starts its own clusters; drop {', '.join(clash)}")
    if ns.prefill_instances < 1 or ns.decode_instances < 1:
        raise ValueError("--prefill-instances and --decode-instances must be >= 1 (a disaggregated cluster)")
    if ns.prefill_num_pages < 0:
        raise ValueError(f"--prefill-num-pages must be >= 0 (got {ns.prefill_num_pages})")
    return policies


@dataclass(frozen=True)
class Topology:
    prefill: int
    decode: int
    prefill_num_pages: int  # 0: derived
    model: str
    extra: tuple[str, ...]

    def describe(self) -> str:
        pool = f"{self.prefill_num_pages} KV pages each" if self.prefill_num_pages else "KV pool derived"
        more = f"; service flags: {' '.join(self.extra)}" if self.extra else ""
        return (
            f"1 gateway, {self.prefill} prefill ({pool}), {self.decode} decode (KV pool derived), etcd + NATS, "
            f"every service --threads 1, model {Path(self.model).name}{more}"
        )


def _up_options(policy: str, topo: Topology, run_dir: Path):  # -> UpOptions
    from shared.cluster.localcluster.plan import UpOptions
    from shared.cluster.localcluster.servers import free_port

    role_extra: dict[str, tuple[str, ...]] = (
        {"prefill": ("--num-pages", str(topo.prefill_num_pages))} if topo.prefill_num_pages else {}
    )
    extra = (
        "--model",
        topo.model,
        "--threads",
        "1",
        "--routing-policy",
        policy,
        "--port",
        str(free_port()),
        *topo.extra,
    )
    return UpOptions(
        run_dir=str(run_dir),
        cluster=f"bench-{policy}",
        etcd_port=free_port(),
        nats_port=free_port(),
        counts={"gateway": 1, "prefill": topo.prefill, "decode": topo.decode},
        extra=extra,
        role_extra=role_extra,
        ready_timeout_s=READY_TIMEOUT_S,
        echo_log=False,
    )


def scrape_counters(address: str, names: tuple[str, ...]) -> dict[str, float]:
    """The named counters (Prometheus text, `_total` samples) at http://address/metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10.0) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(names, 0.0)
    for fam in text_string_to_metric_families(text):
        if fam.name in out:
            out[fam.name] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return out


PREFIX_COUNTERS = ("pdrelay:prefix_cache_queries", "pdrelay:prefix_cache_hits")


def prefix_stats(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Hit rate over the measured run from per-instance counter snapshots, and each instance's share of tokens."""
    per: dict[str, dict[str, float]] = {}
    for iid in sorted(after):
        q = after[iid][PREFIX_COUNTERS[0]] - before.get(iid, {}).get(PREFIX_COUNTERS[0], 0.0)
        h = after[iid][PREFIX_COUNTERS[1]] - before.get(iid, {}).get(PREFIX_COUNTERS[1], 0.0)
        per[iid] = {"prompt_tokens": q, "cached_tokens": h}
    queries = sum(v["prompt_tokens"] for v in per.values())
    hits = sum(v["cached_tokens"] for v in per.values())
    return {
        "prefill_prompt_tokens": queries,
        "prefill_cached_tokens": hits,
        "prefill_prefix_hit_rate": hits / queries if queries else 0.0,
        "per_prefill": per,
    }


async def _measure(
    base_url: str,
    requests: list[BenchRequest],
    ns: argparse.Namespace,
    tok: BenchTokenizer,
    prefills: dict[str, str],
    slo: Slo | None,
    percentiles: tuple[float, ...],
    deadline: float,
) -> dict[str, Any]:
    conns = max(1, min(len(requests), ns.max_concurrency or len(requests)))
    http = make_http(ns.http_client, base_url, api_key=ns.api_key, max_connections=conns)
    try:
        model = ns.model or await served_model(http)
        extra = json.loads(ns.extra_body) if ns.extra_body else {}
        opts = RequestOptions(
            ns.endpoint, model, ignore_eos=ns.ignore_eos, temperature=ns.temperature, extra_body=extra
        )
        if ns.num_warmups > 0:
            warm = random_dataset(
                tok, num_prompts=ns.num_warmups, input_len=WARMUP_INPUT_LEN, output_len=4, seed=ns.seed + 7919
            )
            out = await warm_up(
                http,
                opts,
                warm,
                max_concurrency=ns.max_concurrency,
                timeout_s=ns.timeout_s,
                count_tokens=tok.count,
                deadline_s=max(0.0, deadline - time.monotonic()),
            )
            bad = [r.error for r in out.results if not r.success]
            if bad:
                raise RuntimeError(f"warm-up requests to {base_url} failed: {bad[0]}")
        snap = lambda: {iid: scrape_counters(addr, PREFIX_COUNTERS) for iid, addr in prefills.items()}
        before = await asyncio.to_thread(snap)
        workload = Workload(
            tuple(requests),
            request_rate=ns.request_rate,
            burstiness=ns.burstiness,
            max_concurrency=ns.max_concurrency,
            seed=ns.seed,
            timeout_s=ns.timeout_s,
        )
        outcome = await run_workload(
            http, opts, workload, count_tokens=tok.count, deadline_s=max(0.0, deadline - time.monotonic())
        )
        after = await asyncio.to_thread(snap)
    finally:
        await http.aclose()
    summary: dict[str, Any] = {"base_url": base_url, "model": model}
    summary.update(compute_metrics(outcome.results, outcome.duration_s, percentiles=percentiles, slo=slo))
    summary.update(prefix_stats(before, after))
    summary["partial"] = outcome.stopped is not None
    errors = [r.error for r in outcome.results if not r.success]
    if errors:
        _log(f"{len(errors)} requests failed; first: {errors[0]}")
    return summary


def _log(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


@contextmanager
def detached_cluster(
    label: str, opts: Any, run_dir: Path, about: str = "", ready_note: str = ""
) -> Iterator[tuple[str, dict[str, tuple[str, Any]]]]:
    """`pdrelay up` in the background (opts: UpOptions) for one side of a comparison: yields the gateway's base
    URL and, by instance id, each child's (role, ReadyInfo or None from run_dir/ready); stops it on the way out."""
    from shared.cluster.handshake import read_ready_file
    from shared.cluster.localcluster import detached

    _log(f"{label}: starting a cluster{about} in {run_dir}")
    t0 = time.monotonic()
    try:
        state = detached.start(opts)
        gateway = next(c for c in state.children if c.role == "gateway")
        ready = {
            c.instance_id: (c.role, read_ready_file(run_dir / "ready" / f"{c.instance_id}.json"))
            for c in state.children
        }
        _log(f"{label}: ready in {time.monotonic() - t0:.0f} s; gateway http://{gateway.http}{ready_note}")
        yield f"http://{gateway.http}", ready
    finally:
        detached.stop(run_dir, timeout_s=30.0, say=lambda m: _log(f"{label}: {m}"))


def _run_one(
    policy: str,
    topo: Topology,
    requests: list[BenchRequest],
    ns: argparse.Namespace,
    tok: BenchTokenizer,
    slo: Slo | None,
    percentiles: tuple[float, ...],
    tmp: Path,
    deadline: float,
) -> dict[str, Any]:
    run_dir = tmp / policy
    note = f"; {len(requests)} requests, concurrency {ns.max_concurrency or 'unlimited'}"
    with detached_cluster(policy, _up_options(policy, topo, run_dir), run_dir, f" ({topo.describe()})", note) as (
        url,
        ready,
    ):
        prefills = {}
        for iid, (role, info) in ready.items():
            if role == "prefill":
                if info is None or not info.metrics:
                    raise RuntimeError(f"{iid} announced no metrics address; the hit rate needs it")
                prefills[iid] = info.metrics
        summary = asyncio.run(_measure(url, requests, ns, tok, prefills, slo, percentiles, deadline))
    summary["label"] = policy
    _log(
        f"{policy}: mean TTFT {summary['mean_ttft_ms']:.0f} ms, prefill prefix hit rate "
        f"{summary['prefill_prefix_hit_rate']:.1%}"
    )
    return summary


def policy_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """Per policy: mean / median TTFT, prefill hit rate and prompt tokens per prefill; then each policy's mean
    and median TTFT over the first policy's (> 1: the first is faster)."""
    lines = [f"{'policy':<12} {'mean TTFT':>10} {'median TTFT':>12} {'prefix hit rate':>16}  prompt tokens per prefill"]
    for s in summaries:
        split = " / ".join(f"{iid} {v['prompt_tokens']:.0f}" for iid, v in s["per_prefill"].items())
        lines.append(
            f"{s['label']:<12} {s['mean_ttft_ms']:>7.0f} ms {s['median_ttft_ms']:>9.0f} ms "
            f"{s['prefill_prefix_hit_rate']:>16.1%}  {split}"
        )
    first = summaries[0]
    for s in summaries[1:]:
        mean, median = ttft_ratios(s, first)
        lines.append(f"TTFT {s['label']} / {first['label']}: mean {_x(mean)}, median {_x(median)}")
    return lines


def ttft_ratios(other: dict[str, Any], first: dict[str, Any]) -> tuple[float | None, float | None]:
    def r(key: str) -> float | None:
        return other[key] / first[key] if first.get(key) else None

    return r("mean_ttft_ms"), r("median_ttft_ms")


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def workload_line(ns: argparse.Namespace) -> str:
    rate = "all at once" if math.isinf(ns.request_rate) else f"{ns.request_rate:g} req/s"
    if ns.dataset == "shared-prefix":
        what = (
            f"shared-prefix: {ns.shared_prefix_groups} groups x {ns.shared_prefix_system_len}-token system "
            f"prompts + {ns.random_input_len}-token questions"
        )
    else:
        what = f"{ns.dataset}: {ns.random_input_len}-token prompts"
    return (
        f"{what}, {ns.random_output_len} output tokens, {ns.num_prompts} requests, concurrency "
        f"{ns.max_concurrency or 'unlimited'}, {rate}, seed {ns.seed}"
    )


def run_policies(
    ns: argparse.Namespace,
    requests: list[BenchRequest],
    tok: BenchTokenizer,
    tokenizer_dir: Path,
    settings: dict[str, Any],
    slo: Slo | None,
    percentiles: tuple[float, ...],
) -> int:
    policies = validate(ns)
    import shlex

    topo = Topology(
        ns.prefill_instances,
        ns.decode_instances,
        ns.prefill_num_pages,
        str(tokenizer_dir),
        tuple(shlex.split(ns.cluster_flags)),
    )
    summaries: list[dict[str, Any]] = []
    deadline = time.monotonic() + ns.total_timeout_s  # a late policy's run stops there, reported as partial
    with tempfile.TemporaryDirectory(prefix="pdrelay-bench-policies-") as tmp:
        for policy in policies:
            summaries.append(_run_one(policy, topo, requests, ns, tok, slo, percentiles, Path(tmp), deadline))
    partial = any(s["partial"] for s in summaries)
    print(f"Topology (each policy): {topo.describe()}")
    print(f"Workload: {workload_line(ns)}; fresh cluster per policy, in this order: {', '.join(policies)}")
    title = "Routing policies (same workload, one run)" + (" (partial)" if partial else "")
    print(
        format_table(
            title,
            summaries[0],
            percentiles,
            compare=summaries[1],
            labels=(summaries[0]["label"], summaries[1]["label"]),
        )
    )
    for line in policy_lines(summaries):
        print(line)
    if ns.output_json:
        doc = {
            **settings,
            "topology": topo.describe(),
            "policies": summaries,
            "partial": partial,
            "ttft_ratios": {
                s["label"]: dict(zip(("mean", "median"), ttft_ratios(s, summaries[0]), strict=True))
                for s in summaries[1:]
            },
        }
        Path(ns.output_json).write_text(json.dumps(doc, indent=2) + "\n")
        _log(f"wrote {ns.output_json}")
    if partial:
        return 1
    return 0 if all(s["completed"] == len(requests) for s in summaries) else 1
