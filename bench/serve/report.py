"""The serving benchmark's table (vLLM's layout; with a peer, side by side with ratios) and its JSON document."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.serve.metrics import METRIC_TITLES, METRICS, RequestResult, percentile_key

Summary = Mapping[str, Any]
_WIDTH = 50

# (label, key, format) of the scalar rows, in vLLM's order
_HEAD_ROWS: tuple[tuple[str, str, str], ...] = (
    ("Successful requests", "completed", "{:.0f}"),
    ("Failed requests", "failed", "{:.0f}"),
    ("Benchmark duration (s)", "duration", "{:.2f}"),
    ("Total input tokens", "total_input_tokens", "{:.0f}"),
    ("Total generated tokens", "total_output_tokens", "{:.0f}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Request goodput (req/s)", "request_goodput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.2f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.2f}"),
)
_CPU_ROWS: tuple[tuple[str, str, str], ...] = (
    ("Gateway CPU per request (us)", "gateway_cpu_us_per_request", "{:.1f}"),
    ("Worker CPU per request (us)", "worker_cpu_us_per_request", "{:.1f}"),  # a peer's separate engine
    ("Client CPU per request (us)", "client_cpu_us_per_request", "{:.1f}"),
)
# Keys whose target/compare ratio is printed and saved (counts and durations are not comparable quantities).
RATIO_KEYS_FIXED = (
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "gateway_cpu_us_per_request",
    "client_cpu_us_per_request",
)


def _rows(
    summary: Summary, percentiles: Sequence[float], compare: Summary | None = None
) -> list[tuple[str, str, str] | str]:
    rows: list[tuple[str, str, str] | str] = [r for r in _HEAD_ROWS if r[1] in summary]
    for m in METRICS:
        rows.append(METRIC_TITLES[m])
        rows.append((f"Mean {m.upper()} (ms)", f"mean_{m}_ms", "{:.2f}"))
        rows.append((f"Median {m.upper()} (ms)", f"median_{m}_ms", "{:.2f}"))
        for p in percentiles:
            rows.append((f"P{percentile_key(p)[1:]} {m.upper()} (ms)", f"{percentile_key(p)}_{m}_ms", "{:.2f}"))
    cpu = [r for r in _CPU_ROWS if summary.get(r[1]) is not None or (compare or {}).get(r[1]) is not None]
    if cpu:
        rows.append("CPU")
        rows.extend(cpu)
    return rows


def ratio_keys(percentiles: Sequence[float]) -> list[str]:
    keys = list(RATIO_KEYS_FIXED)
    for m in METRICS:
        keys += [f"mean_{m}_ms", f"median_{m}_ms", *(f"{percentile_key(p)}_{m}_ms" for p in percentiles)]
    return keys


def ratios(target: Summary, compare: Summary, percentiles: Sequence[float]) -> dict[str, float | None]:
    """target / compare for every comparable key both have (None where compare is 0)."""
    out: dict[str, float | None] = {}
    for k in ratio_keys(percentiles):
        a, b = target.get(k), compare.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[k] = a / b if b else None
    return out


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "-"
    return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else str(v)


def format_table(
    title: str,
    target: Summary,
    percentiles: Sequence[float],
    *,
    compare: Summary | None = None,
    labels: tuple[str, str] = ("target", "compare"),
) -> str:
    """vLLM's result block; with `compare`, two value columns and their ratio (target/compare)."""
    rows = _rows(target, percentiles, compare)
    if compare is None:
        lines = [f"{' ' + title + ' ':=^{_WIDTH}}"]
        for row in rows:
            if isinstance(row, str):
                lines.append(f"{' ' + row + ' ':-^{_WIDTH}}")
            else:
                label, key, fmt = row
                lines.append(f"{label + ':':<40}{_fmt(fmt, target.get(key)):>10}")
        lines.append("=" * _WIDTH)
        return "\n".join(lines)
    width = 40 + 3 * 14
    rat = ratios(target, compare, percentiles)
    lines = [f"{' ' + title + ' ':=^{width}}", f"{'':<40}{labels[0][:13]:>14}{labels[1][:13]:>14}{'ratio':>14}"]
    for row in rows:
        if isinstance(row, str):
            lines.append(f"{' ' + row + ' ':-^{width}}")
        else:
            label, key, fmt = row
            r = rat.get(key)
            lines.append(
                f"{label + ':':<40}{_fmt(fmt, target.get(key)):>14}{_fmt(fmt, compare.get(key)):>14}"
                f"{_fmt('{:.3f}', r) if key in rat else '':>14}"
            )
    lines.append("=" * width)
    lines.append(f"ratio = {labels[0]} / {labels[1]}: below 1 is better for latencies and CPU, above 1 for throughput")
    return "\n".join(lines)


def headline(doc: Mapping[str, Any]) -> str:
    """The gateway-overhead figures in one block: p50 E2E and gateway CPU at the main concurrency, request
    throughput at --throughput-concurrency, each with its ratio (ours / peer)."""
    cmp = doc["compare"]
    lines = [f"{doc['label']} vs {cmp['label']} (ratio = {doc['label']} / {cmp['label']}):"]

    def line(name: str, a: Any, b: Any, fmt: str) -> None:
        r = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        lines.append(f"  {name:<44}{_fmt(fmt, a):>12}{_fmt(fmt, b):>12}   ratio {_fmt('{:.3f}', r)}")

    conc = doc.get("max_concurrency") or "unlimited"
    line(f"p50 E2E (ms), concurrency {conc}", doc.get("median_e2el_ms"), cmp.get("median_e2el_ms"), "{:.3f}")
    line(f"p99 E2E (ms), concurrency {conc}", doc.get("p99_e2el_ms"), cmp.get("p99_e2el_ms"), "{:.3f}")
    line(
        f"gateway CPU/request (us), concurrency {conc}",
        doc.get("gateway_cpu_us_per_request"),
        cmp.get("gateway_cpu_us_per_request"),
        "{:.1f}",
    )
    tp = doc.get("throughput_phase")
    if tp and "compare" in tp:
        c = tp.get("max_concurrency")
        line(
            f"throughput (req/s), concurrency {c}",
            tp.get("request_throughput"),
            tp["compare"].get("request_throughput"),
            "{:.1f}",
        )
        line(
            f"gateway CPU/request (us), concurrency {c}",
            tp.get("gateway_cpu_us_per_request"),
            tp["compare"].get("gateway_cpu_us_per_request"),
            "{:.1f}",
        )
    return "\n".join(lines)


def detailed(results: Sequence[RequestResult]) -> dict[str, list[Any]]:
    """vLLM's per-request lists (--save-detailed)."""
    return {
        "input_lens": [r.prompt_tokens for r in results],
        "output_lens": [r.output_tokens for r in results],
        "ttfts": [r.ttft_s for r in results],
        "itls": [list(r.itl_s) for r in results],
        "generated_texts": [r.generated_text for r in results],
        "errors": [r.error for r in results],
    }
