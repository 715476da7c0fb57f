"""One measured run against one endpoint: warm up, run the workload, and summarize it in vLLM's keys with the CPU
the endpoint's processes (and this client) spent per request. `pdrelay bench serve` runs it once per endpoint and
phase (bench/serve/main.py); the --compare-peer run calls it for each server it starts (bench/serve/compare.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.serve.client import RequestOptions, served_model
from bench.serve.datasets import BenchRequest, BenchTokenizer
from bench.serve.http_client import HttpError, StreamingHttp, make_http
from bench.serve.metrics import Slo, compute_metrics
from bench.serve.procs import CpuSample, process_cpu
from bench.serve.runner import RunOutcome, Workload, run_workload, warm_up


@dataclass(frozen=True)
class Target:
    label: str
    base_url: str
    model: str | None
    pid: int | None  # front process: its CPU is the gateway's
    worker_pids: tuple[int, ...] = ()  # reported apart (a peer's separate engine processes)
    flag: str = ""  # the flag that named base_url, for errors


def _log(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


def _cpu(pid: int | None) -> CpuSample | None:
    return process_cpu(pid) if pid is not None else None


def _cpu_sum(pids: tuple[int, ...]) -> CpuSample | None:
    if not pids:
        return None
    samples = [process_cpu(p) for p in pids]
    sched = [s.sched_s for s in samples]
    return CpuSample(sum(s.stat_s for s in samples), None if None in sched else sum(s for s in sched if s is not None))


async def measure(
    target: Target,
    requests: list[BenchRequest],
    ns: argparse.Namespace,
    *,
    tok: BenchTokenizer,
    stop: asyncio.Event,
    deadline: float,
    slo: Slo | None,
    percentiles: tuple[float, ...],
    max_concurrency: int | None,
    on_start: Callable[[], None] | None = None,
    warm: list[BenchRequest] | None = None,
) -> tuple[dict[str, Any], RunOutcome]:
    """Warm up, then run the workload against one target; the summary dict has vLLM's keys plus CPU figures.
    on_start runs after the warm-up, right before the measured run (e.g. to snapshot server counters). warm: the
    warm-up requests (default: the first --num-warmups of `requests`, which then meet a warm prefix cache)."""
    workload = Workload(
        tuple(requests),
        request_rate=ns.request_rate,
        burstiness=ns.burstiness,
        max_concurrency=max_concurrency,
        seed=ns.seed,
        timeout_s=ns.timeout_s,
    )
    conns = min(len(requests), max_concurrency or len(requests))
    http = make_http(
        ns.http_client, target.base_url, api_key=ns.api_key, max_connections=max(conns, 1), quickack=ns.tcp_quickack
    )
    count: Callable[[str], int] = tok.count
    try:
        model = await _served_model(http, target, deadline)
        extra = json.loads(ns.extra_body) if ns.extra_body else {}
        opts = RequestOptions(
            ns.endpoint, model, ignore_eos=ns.ignore_eos, temperature=ns.temperature, extra_body=extra
        )
        warm = requests[: ns.num_warmups] if warm is None else warm
        if warm:
            _log(f"{target.label}: {len(warm)} warm-up requests to {target.base_url} ({model})")
            warmed = await warm_up(
                http,
                opts,
                warm,
                max_concurrency=max_concurrency,
                timeout_s=ns.timeout_s,
                count_tokens=count,
                stop=stop,
                deadline_s=max(0.0, deadline - time.monotonic()),
            )
            # (stopped during warm-up: the measured run below returns at once, reported as partial)
            bad = [r.error for r in warmed.results if not r.success]
            if bad:
                raise RuntimeError(f"{target.label}: warm-up requests to {target.base_url} failed: {bad[0]}")
        _log(
            f"{target.label}: {len(requests)} requests, rate {ns.request_rate:g}/s, "
            f"concurrency {max_concurrency or 'unlimited'}"
        )
        if on_start is not None:
            on_start()
        before = _CpuSnapshot.take(target)
        outcome = await run_workload(
            http, opts, workload, count_tokens=count, stop=stop, deadline_s=max(0.0, deadline - time.monotonic())
        )
        after = _CpuSnapshot.take(target)
    finally:
        await http.aclose()
    summary: dict[str, Any] = {"label": target.label, "base_url": target.base_url, "model": model}
    summary.update(compute_metrics(outcome.results, outcome.duration_s, percentiles=percentiles, slo=slo))
    summary.update(_cpu_per_request(target, before, after, max(1, len(outcome.results))))
    summary["max_concurrency"] = max_concurrency
    summary["partial"] = outcome.stopped is not None
    summary["stopped"] = outcome.stopped
    errors = [r.error for r in outcome.results if not r.success]
    if errors:
        _log(f"{target.label}: {len(errors)} requests failed; first: {errors[0]}")
    return summary, outcome


async def _served_model(http: StreamingHttp, target: Target, deadline: float) -> str:
    """--model, or the first model the target lists; ValueError naming the flag when it cannot be reached."""
    try:
        async with asyncio.timeout(max(1.0, min(30.0, deadline - time.monotonic()))):
            return target.model or await served_model(http)
    except (OSError, TimeoutError, HttpError) as e:
        raise ValueError(
            f"{target.flag + ' ' if target.flag else ''}cannot reach {target.base_url} (GET /v1/models: {type(e).__name__}: {e}); start "
            f"the server, fix the URL, or pass --model if it has no /v1/models"
        ) from None


@dataclass(frozen=True)
class _CpuSnapshot:
    """CPU used so far by the target's front process, its worker processes (summed) and this client."""

    gateway: CpuSample | None
    workers: CpuSample | None
    client_s: float

    @classmethod
    def take(cls, target: Target) -> _CpuSnapshot:
        return cls(_cpu(target.pid), _cpu_sum(target.worker_pids), time.process_time())


def _cpu_per_request(target: Target, before: _CpuSnapshot, after: _CpuSnapshot, finished: int) -> dict[str, Any]:
    """CPU microseconds per finished request of the client, the front process and the workers (those measured)."""
    out: dict[str, Any] = {"client_cpu_us_per_request": (after.client_s - before.client_s) / finished * 1e6}
    if before.gateway is not None and after.gateway is not None:
        used = after.gateway.minus(before.gateway)
        out["gateway_pid"] = target.pid
        out["gateway_cpu_us_per_request"] = used.best_s / finished * 1e6
        out["gateway_cpu_us_per_request_ticks"] = used.stat_s / finished * 1e6
    if before.workers is not None and after.workers is not None:
        out["worker_pids"] = list(target.worker_pids)
        out["worker_cpu_us_per_request"] = after.workers.minus(before.workers).best_s / finished * 1e6
    return out


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # measured: 10-25% less client CPU per request than the default loop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
