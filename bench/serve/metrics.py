"""Serving-benchmark metrics, defined as vLLM's `benchmark_serving` defines them, so numbers compare 1:1.

Per request (times in seconds, from just before the request is sent):
    ttft   first chunk that carries generated text
    itl    gaps between consecutive text-carrying chunks (one entry per chunk, not per token: a server that
           streams several tokens per chunk shows fewer, larger gaps, exactly as in vLLM)
    e2el   until the last chunk with choices (the one with finish_reason)
    tpot   (e2el - ttft) / (output_tokens - 1), only for requests with more than one output token

Aggregates: mean, median, population std (numpy's default) and linear-interpolated percentiles (numpy's
default) over successful requests; an empty list reads 0, as in vLLM. Goodput counts requests meeting every
SLO given (a request with one output token has tpot 0 for this purpose, as in vLLM).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# metric name -> what it measures; the order of keys in the JSON and the table
METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
METRIC_TITLES: Mapping[str, str] = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}


@dataclass(frozen=True)
class RequestResult:
    """What one request measured. Times are seconds; `itl_s` has one gap per text chunk after the first."""

    success: bool
    ttft_s: float = 0.0
    itl_s: tuple[float, ...] = ()
    latency_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str = ""
    generated_text: str = ""

    @property
    def tpot_s(self) -> float:
        """vLLM's TPOT; 0 when there is at most one output token (no decode interval to measure)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in milliseconds for goodput; None means not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None

    def met_by(self, r: RequestResult) -> bool:
        return (
            (self.ttft_ms is None or r.ttft_s * 1e3 <= self.ttft_ms)
            and (self.tpot_ms is None or r.tpot_s * 1e3 <= self.tpot_ms)
            and (self.e2el_ms is None or r.latency_s * 1e3 <= self.e2el_ms)
        )

    def as_dict(self) -> dict[str, float]:
        return {
            k: v
            for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2el_ms", self.e2el_ms))
            if v is not None
        }


def parse_slo(spec: str) -> Slo:
    """`ttft_ms=500,tpot_ms=50` (also vLLM's `ttft:500 tpot:50` spelling, with or without `_ms`)."""
    values: dict[str, float] = {}
    for item in spec.replace(" ", ",").split(","):
        if not item:
            continue
        key, sep, value = item.replace(":", "=").partition("=")
        name = key.strip().lower().removesuffix("_ms")
        if not sep or name not in ("ttft", "tpot", "e2el"):
            raise ValueError(
                f"--slo {spec!r}: {item!r} is not KEY=MS with KEY one of ttft_ms, tpot_ms, e2el_ms; "
                f"try --slo ttft_ms=500,tpot_ms=50"
            )
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--slo {spec!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0 or math.isinf(ms):
            raise ValueError(f"--slo {spec!r}: {name}_ms must be a positive number of milliseconds (got {value})")
        values[f"{name}_ms"] = ms
    if not values:
        raise ValueError(f"--slo {spec!r} names no objective; try --slo ttft_ms=500,tpot_ms=50")
    return Slo(**values)


def parse_percentiles(spec: str) -> tuple[float, ...]:
    """`99` or `50,90,99` -> (50.0, 90.0, 99.0)."""
    out: list[float] = []
    for item in spec.split(","):
        try:
            p = float(item)
        except ValueError:
            raise ValueError(f"--metric-percentiles {spec!r}: {item!r} is not a number; try 50,90,99") from None
        if not 0 < p <= 100:
            raise ValueError(f"--metric-percentiles {spec!r}: {item} must be in (0, 100]")
        out.append(p)
    return tuple(sorted(set(out)))


def percentile_key(p: float) -> str:
    """99 -> 'p99', 99.9 -> 'p99.9' (vLLM's spelling)."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


# ------------------------------------------------------------ statistics (numpy's definitions, no numpy import)


def mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else 0.0


def std(xs: Sequence[float]) -> float:
    """Population standard deviation (numpy.std with ddof=0)."""
    if not xs:
        return 0.0
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy.percentile's default 'linear' method)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    rank = p / 100.0 * (len(s) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def _describe(prefix_ms: dict[str, float], name: str, xs_s: Sequence[float], percentiles: Iterable[float]) -> None:
    prefix_ms[f"mean_{name}_ms"] = mean(xs_s) * 1e3
    prefix_ms[f"median_{name}_ms"] = percentile(xs_s, 50) * 1e3
    prefix_ms[f"std_{name}_ms"] = std(xs_s) * 1e3
    for p in percentiles:
        prefix_ms[f"{percentile_key(p)}_{name}_ms"] = percentile(xs_s, p) * 1e3


def compute_metrics(
    results: Sequence[RequestResult], duration_s: float, *, percentiles: Sequence[float] = (99,), slo: Slo | None = None
) -> dict[str, float | int]:
    """vLLM's summary keys from per-request results. `duration_s` is the wall time of the measured phase."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0 (got {duration_s})")
    ok = [r for r in results if r.success]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok]
    tpots = [r.tpot_s for r in ok if r.output_tokens > 1]
    itls = [gap for r in ok for gap in r.itl_s]
    e2els = [r.latency_s for r in ok]
    out: dict[str, float | int] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
    }
    if slo is not None and not slo.empty:
        out["request_goodput"] = sum(1 for r in ok if slo.met_by(r)) / duration_s
    for name, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        _describe(out, name, xs, percentiles)
    return out
