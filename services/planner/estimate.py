"""What the planner believes about each role, from the instances' load reports: estimated TTFT of the prefill
pool and ITL of the decode pool, at the current size and at other sizes, and the size the load needs.

    prefill   TTFT(n) = pending prompt tokens / (n x measured prefill rate) + one step
              (the rate is tokens per second of step time, reported by each instance and smoothed here)
    decode    ITL(n)  = c x (a + k x (running + waiting requests) / n)
              (a and k: an online least-squares line through recent (batch, step time) reports; c: the client-
              visible ITL the gateways measured over the engines' step time, smoothed, 1 .. CORRECTION_MAX)

Pure functions over plain data: no I/O, unit-tested without processes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.planner.forecast import CORRECTION_MAX

# A pool busier than this queues: sustained load above it is a reason to grow even before TTFT breaks.
UTIL_HIGH = 0.85
# A decode pool whose fullest instance has less than this share of KV pages free cannot admit much more.
KV_LOW = 0.05
RATE_SMOOTHING = 0.5  # weight of the newest prefill-rate measurement
ITL_POINTS = 64  # (batch, step time) points kept for the decode regression


@dataclass(frozen=True)
class InstanceLoad:
    """One ready instance's latest load report, as the policy needs it."""

    instance_id: str
    running: int = 0
    queued: int = 0
    pending_prefill_tokens: int = 0
    free_pages: int = 0
    total_pages: int = 0
    step_ms: float = 0.0
    busy: float = 0.0
    compute_tokens_per_s: float = 0.0


@dataclass
class Learned:
    """What estimation remembers between evaluations (per role)."""

    prefill_rate: float = 0.0  # tokens per second of step time, one instance
    itl_points: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=ITL_POINTS))
    itl_line: tuple[float, float] | None = None  # the last fit (a s, k s per request)
    itl_correction: float = 1.0  # client-visible ITL / engine step time (smoothed)


@dataclass(frozen=True)
class Estimate:
    """`now_s`: the estimate at the current size (None: nothing measured yet); `fewer_s`: with one instance
    fewer; `needed`: the size the load needs; `pressure`: a reason to grow regardless of the estimate."""

    now_s: float | None
    fewer_s: float | None
    needed: int
    util: float  # busy share summed over the pool (instance-equivalents of work)
    pressure: str = ""
    numbers: dict[str, float] = field(default_factory=dict)
    at: Callable[[int], float | None] = lambda m: None  # the estimate with m instances (None: unknown)
    floor_s: float = 0.0  # what no number of instances goes below (one step; decode's step at batch 0)
    load: float = 0.0  # what the estimate scales with: decode's requests, prefill's pending prompt tokens
    at_load: Callable[[int, float], float | None] = lambda m, load: None  # with m instances and that load

    def calm(self, m: int, target_s: float, hysteresis: float, load: float | None = None) -> bool:
        """With m instances (and `load` instead of the present one) the estimate stays `hysteresis` of the
        headroom (target - floor) under the target: a floor close to the target (a slow step) still leaves room
        to scale down."""
        got = self.at(m) if load is None or load <= self.load else self.at_load(m, load)
        if got is None:
            return False
        floor = min(self.floor_s, target_s)
        return got <= floor + (target_s - floor) * (1 - hysteresis)


def estimate_prefill(
    loads: tuple[InstanceLoad, ...],
    n: int,
    learned: Learned,
    target_s: float,
    client_ttft_s: float | None = None,
) -> Estimate:
    """client_ttft_s: the mean TTFT the gateways saw over the last interval (None: unknown)."""
    rates = [x.compute_tokens_per_s for x in loads if x.compute_tokens_per_s > 0]
    if rates:
        mean = sum(rates) / len(rates)
        learned.prefill_rate = (
            mean if not learned.prefill_rate else (RATE_SMOOTHING * mean + (1 - RATE_SMOOTHING) * learned.prefill_rate)
        )
    rate = learned.prefill_rate
    pending = sum(x.pending_prefill_tokens for x in loads)
    steps = [x.step_ms for x in loads if x.step_ms > 0]
    base = (sum(steps) / len(steps) / 1e3) if steps else 0.0
    util = sum(x.busy for x in loads)
    numbers = {
        "pending_prompt_tokens": float(pending),
        "prefill_tokens_per_s": rate,
        "step_ms": base * 1e3,
        "busy_instances": util,
    }

    def ttft_at(m: int, tokens: float) -> float | None:
        if not rate:
            return None
        return tokens / (max(m, 1) * rate) + base

    def ttft(m: int) -> float | None:
        return ttft_at(m, pending)

    needed = max(1, math.ceil(util / UTIL_HIGH)) if util else 0
    if rate and pending:
        room = max(target_s - base, 0.1 * target_s)
        needed = max(needed, math.ceil(pending / (rate * room)))
    now, fewer = ttft(n), (ttft(n - 1) if n > 1 else None)
    if client_ttft_s is not None:
        numbers["client_ttft_ms"] = client_ttft_s * 1e3
        # what the clients waited counts when prompts are waiting at prefill (else the wait was elsewhere: a
        # decode admission, a hop): measured on the load ramp, a burst at the pool's maximum kept the model's
        # estimate within the target for 5 s while the clients' TTFT was over it
        if pending and now is not None:
            now = max(now, client_ttft_s)
    pressure = ""
    if n and util / n > UTIL_HIGH:
        pressure = f"prefill busy {util / n:.0%} of the time (> {UTIL_HIGH:.0%})"
    if n == 0 and pending:
        pressure = "no prefill instance for pending prompts"
    if now is not None:
        numbers["est_ttft_ms"] = now * 1e3
    if fewer is not None:
        numbers["est_ttft_fewer_ms"] = fewer * 1e3
    return Estimate(now, fewer, needed, util, pressure, numbers, ttft, base, float(pending), ttft_at)


def _line(points: deque[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares step = a + k * batch; None without two distinct batch sizes."""
    if len({b for b, _ in points}) < 2:
        return None
    nb = len(points)
    mb = sum(b for b, _ in points) / nb
    ms = sum(s for _, s in points) / nb
    var = sum((b - mb) ** 2 for b, _ in points)
    k = max(0.0, sum((b - mb) * (s - ms) for b, s in points) / var)
    return max(0.0, ms - k * mb), k


def estimate_decode(
    loads: tuple[InstanceLoad, ...],
    n: int,
    learned: Learned,
    target_s: float,
    hysteresis: float,
    client_itl_s: float | None = None,
) -> Estimate:
    """client_itl_s: the mean time between tokens the gateways saw over the last interval (None: unknown)."""
    for x in loads:
        if x.running > 0 and x.step_ms > 0:
            learned.itl_points.append((float(x.running), x.step_ms / 1e3))
    demand = sum(x.running + x.queued for x in loads)
    active = [x for x in loads if x.running > 0 and x.step_ms > 0]
    engine = (sum(x.step_ms for x in active) / len(active) / 1e3) if active else None
    line = learned.itl_line = _line(learned.itl_points)
    util = sum(x.busy for x in loads)
    numbers: dict[str, float] = {"requests": float(demand), "busy_instances": util}
    if engine is not None:
        numbers["engine_itl_ms"] = engine * 1e3
    measured = engine
    if client_itl_s is not None and engine is not None:
        # what the engines' step times leave out (hops, queueing behind a busy gateway or servicer) scales with
        # the step: carried into every size's estimate as a factor
        ratio = min(CORRECTION_MAX, max(1.0, client_itl_s / engine))
        learned.itl_correction = RATE_SMOOTHING * ratio + (1 - RATE_SMOOTHING) * learned.itl_correction
        numbers["client_itl_ms"] = client_itl_s * 1e3
        measured = max(engine, client_itl_s)
    corr = learned.itl_correction
    numbers["itl_correction"] = corr
    if measured is not None:
        numbers["measured_itl_ms"] = measured * 1e3

    def itl_at(m: int, requests: float) -> float | None:
        if line is None or m < 1:
            return None
        return corr * (line[0] + line[1] * requests / m)

    def itl(m: int) -> float | None:
        return itl_at(m, demand)

    if line is not None:
        numbers["itl_fit_base_ms"], numbers["itl_fit_per_request_ms"] = line[0] * 1e3, line[1] * 1e3
    model_now = itl(n)
    now = measured if measured is not None else model_now
    if now is not None:
        numbers["est_itl_ms"] = now * 1e3
    fewer = itl(n - 1) if n > 1 else None
    if fewer is None and measured is not None and n > 1 and not demand:
        fewer = measured  # idle pool: one fewer instance changes nothing measurable
    if fewer is not None:
        numbers["est_itl_fewer_ms"] = fewer * 1e3
    needed = 1
    if line is not None and demand:
        aim = target_s * (1 - hysteresis / 2) / corr
        needed = math.ceil(line[1] * demand / (aim - line[0])) if aim > line[0] else n + 1
    pressure = ""
    queued = sum(x.queued for x in loads)
    tight = [x for x in loads if x.total_pages and x.free_pages / x.total_pages < KV_LOW]
    if queued:
        pressure = f"{queued} requests wait for admission at decode"
    elif tight and len(tight) == len(loads):
        pressure = f"every decode instance has < {KV_LOW:.0%} of its KV pages free"
    numbers["waiting_requests"] = float(queued)

    def itl_or_idle(m: int) -> float | None:
        return itl(m) if line is not None else (measured if not demand and m >= 1 else None)

    floor = corr * line[0] if line is not None else (measured or 0.0)
    return Estimate(now, fewer, max(1, needed), util, pressure, numbers, itl_or_idle, floor, float(demand), itl_at)
