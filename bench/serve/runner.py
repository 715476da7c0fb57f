"""Drive a workload against one endpoint: Poisson (gamma) arrivals, a concurrency cap, multi-turn ordering,
a per-request timeout, and an overall deadline or stop event that ends the run with partial results.

Arrivals follow vLLM: the first request goes at t=0, then gaps drawn from a gamma distribution with shape
`burstiness` and mean 1/rate (burstiness 1 = Poisson); rate inf sends everything at once. A request waits for
its arrival time first, then (multi-turn) for the answer to the previous turn of its conversation, then for a
concurrency slot, and only then starts its clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.serve.client import RequestOptions, build_body, prompt_text, send_request
from bench.serve.datasets import BenchRequest
from bench.serve.http_client import StreamingHttp
from bench.serve.metrics import RequestResult


@dataclass(frozen=True)
class Workload:
    requests: tuple[BenchRequest, ...]
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate must be > 0 requests/s or inf (got {self.request_rate})")
        if not self.burstiness > 0:
            raise ValueError(f"--burstiness must be > 0 (got {self.burstiness}); 1 is Poisson")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1 (got {self.max_concurrency})")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout-s must be > 0 (got {self.timeout_s})")


@dataclass(frozen=True)
class RunOutcome:
    """results: one per request that finished (successfully or not), in workload order. stopped: None when
    every request finished, else why the run ended early ('interrupted' or 'deadline')."""

    results: tuple[RequestResult, ...]
    duration_s: float
    num_requests: int
    stopped: str | None = None


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds after the start at which each of n requests is due (non-decreasing, first 0)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)  # gamma scale: mean gap = shape * scale = 1 / rate
    out, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.gammavariate(burstiness, theta)
        out.append(t)
    return out


class _Conversations:
    """Multi-turn state: answers so far, and an event per finished turn."""

    def __init__(self) -> None:
        self.history: dict[int, list[tuple[str, str]]] = {}
        self.done: dict[tuple[int, int], asyncio.Event] = {}
        self.broken: set[int] = set()

    def event(self, conv: int, turn: int) -> asyncio.Event:
        return self.done.setdefault((conv, turn), asyncio.Event())


class _Requests:
    """One run's requests: each waits for its arrival, the previous turn of its conversation and a concurrency
    slot, then is sent; `results` fills in workload order."""

    def __init__(
        self, http: StreamingHttp, opts: RequestOptions, workload: Workload, count_tokens: Callable[[str], int]
    ) -> None:
        self.http, self.opts, self.workload, self.count_tokens = http, opts, workload, count_tokens
        reqs = workload.requests
        # Bodies of requests without history are encoded before the clock starts (client work off the hot path).
        self.bodies = [build_body(r, opts) if r.conversation is None or r.turn == 0 else None for r in reqs]
        self.offsets = arrival_offsets(len(reqs), workload.request_rate, workload.burstiness, workload.seed)
        self.sem = asyncio.Semaphore(workload.max_concurrency) if workload.max_concurrency else None
        self.convs = _Conversations()
        self.results: list[RequestResult | None] = [None] * len(reqs)

    async def one(self, i: int, req: BenchRequest, t0: float) -> None:
        """Request i, due `offsets[i]` after the loop time t0."""
        loop = asyncio.get_running_loop()
        delay = t0 + self.offsets[i] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        conv = req.conversation
        history: Sequence[tuple[str, str]] = ()
        if conv is not None:
            if req.turn > 0:
                await self.convs.event(conv, req.turn - 1).wait()
            if conv in self.convs.broken:
                self.results[i] = RequestResult(False, error=f"turn {req.turn - 1} of conversation {conv} failed")
                self.convs.event(conv, req.turn).set()
                return
            history = tuple(self.convs.history.get(conv, ()))
        result = await self._send(i, req, history)
        self.results[i] = result
        if conv is not None:
            if result.success:
                self.convs.history.setdefault(conv, []).append((str(req.prompt), result.generated_text))
            else:
                self.convs.broken.add(conv)
            self.convs.event(conv, req.turn).set()

    async def _send(self, i: int, req: BenchRequest, history: Sequence[tuple[str, str]]) -> RequestResult:
        """Request i with the conversation's history so far: waits for a slot, then times the answer."""
        body = self.bodies[i]
        if body is None:
            body = build_body(req, self.opts, history)
        prompt_len = req.prompt_len
        if history:
            text = prompt_text(req, history)
            prompt_len = self.count_tokens(text) if text is not None else req.prompt_len
        if self.sem is not None:
            await self.sem.acquire()
        timeout_s = self.workload.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await send_request(
                    self.http, self.opts.endpoint, body, prompt_len=prompt_len, count_tokens=self.count_tokens
                )
        except TimeoutError:
            return RequestResult(False, error=f"no complete answer within --timeout-s {timeout_s:g}")
        finally:
            if self.sem is not None:
                self.sem.release()


async def run_workload(
    http: StreamingHttp,
    opts: RequestOptions,
    workload: Workload,
    *,
    count_tokens: Callable[[str], int],
    stop: asyncio.Event | None = None,
    deadline_s: float | None = None,
) -> RunOutcome:
    """Run every request of `workload`; return early (cancelling what is in flight) when `stop` is set or
    `deadline_s` passes."""
    run = _Requests(http, opts, workload, count_tokens)
    t0 = asyncio.get_running_loop().time()
    start = time.perf_counter()
    tasks = [asyncio.create_task(run.one(i, r, t0)) for i, r in enumerate(workload.requests)]
    ended = await _until_done(tasks, stop, deadline_s)
    stopped = None if ended.complete else ("interrupted" if stop is not None and stop.is_set() else "deadline")
    done = tuple(r for r in run.results if r is not None)
    return RunOutcome(done, ended.at - start, len(workload.requests), stopped)


@dataclass(frozen=True)
class _Ended:
    complete: bool  # every task finished (else the stop event or the deadline ended the run)
    at: float  # time.perf_counter() when the run ended


async def _until_done(tasks: list[asyncio.Task[None]], stop: asyncio.Event | None, deadline_s: float | None) -> _Ended:
    """Waits for every task, the stop event or the deadline, whichever comes first, then cancels what is left:
    nothing outlives the run, whatever ended it (also our own cancellation). Raises a task's exception (a bug in
    the runner, not a failed request: those are results)."""
    everything = asyncio.gather(*tasks)
    waiters: list[asyncio.Future[Any]] = [everything]
    stop_task = asyncio.ensure_future(stop.wait()) if stop is not None else None
    if stop_task is not None:
        waiters.append(stop_task)
    error: BaseException | None = None
    try:
        await asyncio.wait(waiters, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        end = time.perf_counter()
        finished = everything.done()
        if finished and not everything.cancelled():
            error = everything.exception()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if everything.done() and not everything.cancelled():
            everything.exception()  # retrieved: the CancelledError of an early stop is expected
        if stop_task is not None:
            stop_task.cancel()
    if error is not None:
        raise error
    return _Ended(finished, end)


async def warm_up(
    http: StreamingHttp,
    opts: RequestOptions,
    requests: Sequence[BenchRequest],
    *,
    max_concurrency: int | None,
    timeout_s: float,
    count_tokens: Callable[[str], int],
    stop: asyncio.Event | None = None,
    deadline_s: float | None = None,
) -> RunOutcome:
    """Send `requests` (as independent single-turn requests) and wait for them: connections, caches and the
    server's first-request costs are paid before the measured run."""
    single = tuple(dataclasses.replace(r, conversation=None, turn=0) for r in requests)
    workload = Workload(single, max_concurrency=max_concurrency, timeout_s=timeout_s)
    return await run_workload(http, opts, workload, count_tokens=count_tokens, stop=stop, deadline_s=deadline_s)
