"""The workload driver against an in-process fake server: arrivals, concurrency cap, multi-turn ordering,
timeouts, and stopping early with partial results."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bench.serve.client import RequestOptions
from bench.serve.datasets import BenchRequest
from bench.serve.runner import Workload, arrival_offsets, run_workload

OPTS = RequestOptions("/v1/completions", "fake")


class FakeHttp:
    """Answers every request with `max_tokens` chunks " w<i>" spaced `gap` s apart; max_tokens 999 never ends."""

    def __init__(self, gap: float = 0.0) -> None:
        self.gap = gap
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self.started: list[float] = []
        self.finished: list[float] = []

    async def stream(self, path: str, body: bytes) -> AsyncIterator[tuple[float, list[bytes]]]:
        req = json.loads(body)
        self.bodies.append(req)
        self.started.append(time.perf_counter())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            n = req["max_tokens"]
            if n == 999:
                await asyncio.sleep(3600)
            for i in range(n):
                await asyncio.sleep(self.gap)
                yield time.perf_counter(), [json.dumps({"choices": [{"text": f" w{len(self.bodies)}.{i}"}]}).encode()]
            yield time.perf_counter(), [b"[DONE]"]
        finally:
            self.in_flight -= 1
            self.finished.append(time.perf_counter())

    async def get_json(self, path: str) -> Any:
        return {"data": [{"id": "fake"}]}

    async def aclose(self) -> None:
        pass


def _reqs(n: int, out: int = 2) -> tuple[BenchRequest, ...]:
    return tuple(BenchRequest(f" p{i}", 1, out) for i in range(n))


def _count(text: str) -> int:
    return len(text.split())


def test_arrival_offsets() -> None:
    assert arrival_offsets(4, math.inf, 1.0, 0) == [0.0] * 4
    a = arrival_offsets(3000, 50.0, 1.0, seed=7)
    assert a == arrival_offsets(3000, 50.0, 1.0, seed=7) and a != arrival_offsets(3000, 50.0, 1.0, seed=8)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert statistics.fmean(gaps) == pytest.approx(1 / 50, rel=0.08)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.1)  # exponential: CV 1
    b = arrival_offsets(3000, 50.0, 4.0, seed=7)
    gaps_b = [y - x for x, y in zip(b, b[1:])]
    assert statistics.fmean(gaps_b) == pytest.approx(1 / 50, rel=0.08)
    assert statistics.pstdev(gaps_b) / statistics.fmean(gaps_b) == pytest.approx(0.5, rel=0.1)  # gamma k=4


async def test_concurrency_cap_is_respected_and_reached() -> None:
    http = FakeHttp(gap=0.005)
    out = await run_workload(http, OPTS, Workload(_reqs(20, out=3), max_concurrency=3), count_tokens=_count)
    assert out.stopped is None and len(out.results) == 20 and all(r.success for r in out.results)
    assert http.max_in_flight == 3
    assert all(r.output_tokens == 3 and len(r.itl_s) == 2 for r in out.results)


async def test_requests_start_at_their_arrival_times() -> None:
    http = FakeHttp()
    wl = Workload(_reqs(12), request_rate=40.0, seed=3)
    t0 = time.perf_counter()
    out = await run_workload(http, OPTS, wl, count_tokens=_count)
    assert len(out.results) == 12
    due = arrival_offsets(12, 40.0, 1.0, 3)
    starts = sorted(s - t0 for s in http.started)
    for got, want in zip(starts, due):
        assert want - 0.002 <= got <= want + 0.25
    assert out.duration_s >= due[-1]


async def test_multi_turn_waits_for_the_previous_answer_and_sends_it() -> None:
    http = FakeHttp(gap=0.002)
    reqs = tuple(BenchRequest(f" c{c}t{t}", 2, 2, conversation=c, turn=t) for t in range(3) for c in range(2))
    out = await run_workload(http, OPTS, Workload(reqs), count_tokens=_count)
    assert len(out.results) == 6 and all(r.success for r in out.results)
    by_prompt_tail = {b["prompt"].rsplit(" ", 1)[1]: (i, b["prompt"]) for i, b in enumerate(http.bodies)}
    for c in range(2):
        for t in range(1, 3):
            i, prompt = by_prompt_tail[f"c{c}t{t}"]
            j, prev_prompt = by_prompt_tail[f"c{c}t{t - 1}"]
            assert http.finished[j] <= http.started[i], "a turn started before the previous one finished"
            answer = out.results[reqs.index(next(r for r in reqs if r.prompt == f" c{c}t{t - 1}"))].generated_text
            assert prompt == prev_prompt + answer + f" c{c}t{t}"
    # prompt tokens of later turns are counted over the whole conversation (no usage from the fake)
    assert out.results[-1].prompt_tokens == _count(http.bodies[-1]["prompt"])


async def test_per_request_timeout_fails_that_request_only() -> None:
    http = FakeHttp()
    reqs = (BenchRequest(" ok", 1, 2), BenchRequest(" hangs", 1, 999), BenchRequest(" ok2", 1, 2))
    out = await run_workload(http, OPTS, Workload(reqs, timeout_s=0.3), count_tokens=_count)
    assert out.stopped is None
    assert [r.success for r in out.results] == [True, False, True]
    assert "--timeout-s 0.3" in out.results[1].error


@pytest.mark.parametrize("how", ["interrupted", "deadline"])
async def test_stop_returns_partial_results_promptly(how: str) -> None:
    http = FakeHttp()
    reqs = (*_reqs(3), *(BenchRequest(f" long{i}", 1, 999) for i in range(5)))
    stop = asyncio.Event()
    if how == "interrupted":
        asyncio.get_running_loop().call_later(0.2, stop.set)
    t0 = time.perf_counter()
    out = await run_workload(
        http,
        OPTS,
        Workload(reqs, timeout_s=60),
        count_tokens=_count,
        stop=stop,
        deadline_s=0.2 if how == "deadline" else None,
    )
    assert time.perf_counter() - t0 < 2.0
    assert out.stopped == how
    assert len(out.results) == 3 and all(r.success for r in out.results) and out.num_requests == 8
    assert http.in_flight == 0  # the hanging streams were cancelled


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        (dict(request_rate=0.0), "--request-rate"),
        (dict(burstiness=0.0), "--burstiness"),
        (dict(max_concurrency=0), "--max-concurrency"),
        (dict(timeout_s=0.0), "--timeout-s"),
    ],
)
def test_workload_validation_names_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        Workload(_reqs(1), **kwargs)
