"""What `pdrelay bench serve --compare-peer` reports: the workload's compute roofline, each pdrelay engine's profile
from its counters, the medians over rounds, and the comparison table."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.serve.datasets import BenchRequest


# ---- roofline -----------------------------------------------------------------------------------------------------
def workload_flops(model_dir: Path, requests: list[BenchRequest]) -> float:
    """Model FLOPs of serving `requests` (prompt + output tokens): 2 x the dense weights each token passes, the LM
    head for each sampled token only, and 4 x layers x q-width x context for attention (QK^T and PV)."""
    from shared.engine.models import load_model_config

    c = load_model_config(model_dir)
    h, layers = c.hidden_size, c.num_layers
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * c.intermediate_size
    body, head = 2 * layers * per_layer, 2 * h * c.vocab_size
    total = 0.0
    for r in requests:
        n = r.prompt_len + r.output_len
        total += n * body + r.output_len * head
        total += 4 * layers * q * (n * (n + 1) / 2)  # token at position p attends to p + 1 keys
    return total


def matmul_gflops(model_dir: Path) -> float:
    """This box's fp32 matmul rate on the model's MLP shape, all cores (bench engine's measurement)."""
    import os

    import torch

    from bench.engine_roofline import measure_machine
    from shared.engine.models import load_model_config

    c = load_model_config(model_dir)
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        return measure_machine(c.hidden_size, c.intermediate_size, batch=256)["matmul_gflops"]
    finally:
        torch.set_num_threads(1)


# ---- engine counters ----------------------------------------------------------------------------------------------
ENGINE_COUNTERS = ("pdrelay:engine_steps", "pdrelay:engine_step_seconds", "pdrelay:engine_step_tokens")


def engine_profile(before: dict[str, float], after: dict[str, float], duration_s: float) -> dict[str, float]:
    """One engine over a measured run, from its counters: busy share of the wall time (the rest it waited for
    work: the serving path's doing), steps, mean step, and the forward pass's share of busy time."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = d.get("pdrelay:engine_steps", 0.0)
    busy = d.get("pdrelay:engine_step_seconds", 0.0)
    return {
        "engine_busy_share": busy / duration_s if duration_s else 0.0,
        "engine_steps": steps,
        "engine_step_ms": 1e3 * busy / steps if steps else 0.0,
        "engine_tokens_per_step": d.get("pdrelay:engine_step_tokens", 0.0) / steps if steps else 0.0,
        "engine_forward_share": d.get("pdrelay:engine_step_seconds{forward}", 0.0) / busy if busy else 0.0,
    }


def scrape_engine(address: str) -> dict[str, float]:
    """The ENGINE_COUNTERS of one engine's /metrics (per phase too, as `name{phase}`)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10.0) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in ENGINE_COUNTERS:
            for smp in fam.samples:
                if smp.name.endswith("_total"):
                    out[fam.name] = out.get(fam.name, 0.0) + smp.value
                    if "phase" in smp.labels:
                        out[f"{fam.name}{{{smp.labels['phase']}}}"] = smp.value
    return out


# ---- rounds -------------------------------------------------------------------------------------------------------
def _median_numbers(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Key-wise median of the numeric values the dicts share (others from the first dict)."""
    out: dict[str, Any] = dict(dicts[0])
    for k, v in dicts[0].items():
        vals = [d.get(k) for d in dicts]
        nums = [x for x in vals if isinstance(x, (int, float))]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and len(nums) == len(vals):
            out[k] = statistics.median(nums)
    return out


def combine_rounds(rounds: list[dict[str, Any]], floors: list[float]) -> dict[str, Any]:
    """One server's summaries of one workload, a round each (floors: each round's roofline seconds) -> their
    key-wise median, with the per-round throughputs and roofline fractions kept (ratios pair them by round)."""
    out = _median_numbers(rounds)
    out["round_throughputs"] = [r["output_throughput"] for r in rounds]
    out["roofline_fractions"] = [f / r["duration"] if r.get("duration") else 0.0 for r, f in zip(rounds, floors)]
    out["roofline_fraction"] = statistics.median(out["roofline_fractions"])
    engines = [r.get("engines") or {} for r in rounds]
    if engines[0]:
        out["engines"] = {iid: _median_numbers([e[iid] for e in engines if iid in e]) for iid in engines[0]}
    out["rounds"] = rounds
    return out


def ratio(ours: dict[str, Any], peer: dict[str, Any]) -> float | None:
    """Output tok/s over the peer's: the median of the per-round ratios where both ran the same rounds (each
    round's pair measured minutes apart), else the ratio of the two throughputs."""
    a, b = ours.get("round_throughputs"), peer.get("round_throughputs")
    if a and b and len(a) == len(b) and all(b):
        return statistics.median(x / y for x, y in zip(a, b))
    if not peer.get("output_throughput"):
        return None
    return float(ours["output_throughput"]) / float(peer["output_throughput"])


# ---- table --------------------------------------------------------------------------------------------------------
def _ms(s: dict[str, Any], key: str, width: int, digits: int) -> str:
    v = s.get(key)
    return f"{'-':>{width}}" if v is None else f"{v:>{width - 2}.{digits}f}ms"


def comparison_lines(
    results: dict[str, dict[str, dict[str, Any]]], peers: list[str], floors: dict[str, float], workloads: list[str]
) -> list[str]:
    """Per workload: one row per server (output tok/s, TTFT, TPOT, roofline fraction, ratio vs each peer run; with
    rounds, medians and the median per-round ratio), then each round's throughputs and each engine's profile."""
    lines: list[str] = []
    for w in workloads:
        lines.append(f"workload {w}")
        head = (
            f"  {'server':<22}{'out tok/s':>10}{'mean TTFT':>11}{'mean TPOT':>11}{'med TPOT':>10}"
            f"{'p99 ITL':>9}{'roofline':>10}" + "".join(f"{'/ ' + p:>18}" for p in peers)
        )
        lines.append(head)
        for label, by_w in results.items():
            s = by_w.get(w)
            if s is None:
                continue
            frac = s.get("roofline_fraction")
            if frac is None:
                frac = floors[w] / s["duration"] if s.get("duration") else 0.0
            row = (
                f"  {label:<22}{s['output_throughput']:>10.1f}{_ms(s, 'mean_ttft_ms', 11, 0)}"
                f"{_ms(s, 'mean_tpot_ms', 11, 1)}{_ms(s, 'median_tpot_ms', 10, 1)}{_ms(s, 'p99_itl_ms', 9, 0)}"
                f"{frac:>10.1%}"
            )
            for p in peers:
                ps = results.get(p, {}).get(w)
                r = ratio(s, ps) if ps else None
                row += f"{'-' if r is None else f'{r:.2f}x':>18}"
            lines.append(row)
        for label, by_w in results.items():
            tps = (by_w.get(w) or {}).get("round_throughputs") or []
            if len(tps) > 1:
                lines.append(f"  {label} rounds: " + " ".join(f"{t:.1f}" for t in tps) + " tok/s")
        for label, by_w in results.items():
            for iid, prof in (by_w.get(w) or {}).get("engines", {}).items():
                lines.append(
                    f"  {label} {iid}: engine busy {prof['engine_busy_share']:.0%} of the run, "
                    f"{prof['engine_steps']:.0f} steps of {prof['engine_step_ms']:.0f} ms "
                    f"({prof['engine_tokens_per_step']:.0f} tokens each), forward pass "
                    f"{prof['engine_forward_share']:.0%} of it"
                )
    return lines
