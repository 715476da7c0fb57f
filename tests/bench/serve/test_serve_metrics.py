"""Serving metrics against independent computations: numpy for the statistics, vLLM's formulas written out."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.serve.metrics import (
    RequestResult,
    Slo,
    compute_metrics,
    mean,
    parse_percentiles,
    parse_slo,
    percentile,
    percentile_key,
    std,
)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_statistics_match_numpy(n: int) -> None:
    rng = random.Random(n)
    xs = [rng.expovariate(1.0) for _ in range(n)]
    assert mean(xs) == pytest.approx(float(np.mean(xs)))
    assert std(xs) == pytest.approx(float(np.std(xs)), abs=1e-12)
    for p in (1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p))), p


def test_empty_statistics_read_zero_like_vllm() -> None:
    assert (mean([]), std([]), percentile([], 99)) == (0.0, 0.0, 0.0)


def _result(ttft: float, gaps: list[float], tokens: int, prompt: int = 10) -> RequestResult:
    return RequestResult(
        True, ttft_s=ttft, itl_s=tuple(gaps), latency_s=ttft + sum(gaps), prompt_tokens=prompt, output_tokens=tokens
    )


def test_tpot_itl_e2el_as_vllm_defines_them() -> None:
    results = [
        _result(0.100, [0.010, 0.030, 0.020], 4),
        _result(0.050, [0.040], 2),
        _result(0.200, [], 1),  # one token: no TPOT entry
        _result(0.070, [0.005, 0.005], 5, prompt=7),  # 2 chunks for 4 decode tokens: ITL is per chunk
        RequestResult(False, error="HTTP 500"),
    ]
    m = compute_metrics(results, duration_s=2.0, percentiles=(50, 99))
    ok = [r for r in results if r.success]
    # vLLM: tpot = (latency - ttft) / (output_len - 1) over requests with output_len > 1
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    assert tpots == pytest.approx([0.060 / 3, 0.040, 0.010 / 4])
    assert m["mean_tpot_ms"] == pytest.approx(np.mean(tpots) * 1e3)
    assert m["p99_tpot_ms"] == pytest.approx(np.percentile(tpots, 99) * 1e3)
    itls = [0.010, 0.030, 0.020, 0.040, 0.005, 0.005]
    assert m["mean_itl_ms"] == pytest.approx(np.mean(itls) * 1e3)
    assert m["median_itl_ms"] == pytest.approx(np.median(itls) * 1e3)
    assert m["std_itl_ms"] == pytest.approx(np.std(itls) * 1e3)
    e2els = [r.latency_s for r in ok]
    assert m["mean_e2el_ms"] == pytest.approx(np.mean(e2els) * 1e3)
    assert m["p50_ttft_ms"] == pytest.approx(np.median([0.1, 0.05, 0.2, 0.07]) * 1e3)
    assert m["completed"] == 4 and m["failed"] == 1
    assert m["total_input_tokens"] == 37 and m["total_output_tokens"] == 12
    assert m["request_throughput"] == pytest.approx(2.0)
    assert m["output_throughput"] == pytest.approx(6.0)
    assert m["total_token_throughput"] == pytest.approx(49 / 2)
    assert "request_goodput" not in m


def test_vllm_keys_present() -> None:
    m = compute_metrics([_result(0.1, [0.01], 2)], 1.0)
    for key in (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
    ):
        assert key in m
    for stat in ("mean", "median", "std", "p99"):
        for name in ("ttft", "tpot", "itl", "e2el"):
            assert f"{stat}_{name}_ms" in m


def test_goodput_counts_requests_meeting_every_slo() -> None:
    results = [
        _result(0.100, [0.010, 0.010], 3),  # ttft 100, tpot 10
        _result(0.300, [0.010, 0.010], 3),  # ttft 300: misses ttft
        _result(0.100, [0.050, 0.050], 3),  # tpot 50: misses tpot
        _result(0.150, [], 1),  # tpot counts as 0 for goodput (vLLM)
        RequestResult(False, error="boom"),
    ]
    m = compute_metrics(results, 2.0, slo=Slo(ttft_ms=200, tpot_ms=20))
    assert m["request_goodput"] == pytest.approx(2 / 2.0)
    m = compute_metrics(results, 2.0, slo=Slo(ttft_ms=200))
    assert m["request_goodput"] == pytest.approx(3 / 2.0)
    m = compute_metrics(results, 2.0, slo=Slo(e2el_ms=150))
    assert m["request_goodput"] == pytest.approx(2 / 2.0)  # 120 ms and 150 ms make it; 320 ms and 200 ms do not


def test_parse_slo_forms_and_errors() -> None:
    assert parse_slo("ttft_ms=500,tpot_ms=50") == Slo(ttft_ms=500, tpot_ms=50)
    assert parse_slo("ttft:500 tpot:50 e2el:2000") == Slo(500, 50, 2000)
    with pytest.raises(ValueError, match="ttft_ms, tpot_ms, e2el_ms"):
        parse_slo("latency=3")
    with pytest.raises(ValueError, match="positive"):
        parse_slo("ttft_ms=-1")
    with pytest.raises(ValueError, match="not a number"):
        parse_slo("ttft_ms=fast")
    with pytest.raises(ValueError, match="names no objective"):
        parse_slo(",")


def test_percentile_options() -> None:
    assert parse_percentiles("99,50,90") == (50.0, 90.0, 99.0)
    assert [percentile_key(p) for p in (50, 99.9)] == ["p50", "p99.9"]
    with pytest.raises(ValueError, match=r"\(0, 100\]"):
        parse_percentiles("0")
    with pytest.raises(ValueError):
        compute_metrics([], 0.0)
