"""Throughput mode: forecast the next intervals' traffic from the gateways' counters and size each role for it.

Every evaluation gives one traffic sample (arrivals per second, mean prompt and answer length, the client-visible
inter-token latency: services/planner/traffic.py). Each series is smoothed with Holt's linear trend

    level_t = a x y_t + (1 - a) x (level_{t-1} + trend_{t-1})
    trend_t = b x (level_t - level_{t-1}) + (1 - b) x trend_{t-1}
    y_{t+h} = level_t + h x trend_t

and read `h` intervals ahead, h = how long a new instance takes to start serving (a scale-up decided now helps
only then). The sizes follow from the per-instance capacities the load mode fitted (services/planner/estimate.py):

    prefill   n = rate x prompt tokens / (tokens per second of one instance x PREFILL_UTIL)
    decode    n = k x C / (aim / correction - a),  C = rate x answer tokens x aim  (streams in flight, Little's
              law), step = a + k x batch (the fitted line), correction = client ITL / engine step time;
              C is also the decode pool's own streams in flight read ahead on their trend (the answer length is
              known only once requests finish: at the start of a ramp the streams' growth is the first sign)

Like Dynamo's throughput planner, but a forecast only ever adds instances ahead of the load or keeps them: the
load mode still scales up on a measured breach, and scales down only when both agree.

Pure: numbers in, numbers out; unit-tested with synthetic samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Share of its time a prefill instance may be busy with the forecast load: above it queueing eats the TTFT target.
PREFILL_UTIL = 0.75
LEVEL_ALPHA = 0.5  # weight of the newest sample in the level
TREND_BETA = 0.2  # weight of the newest level change in the trend
# Poisson counts over a few seconds are noisy and the trend multiplies the noise by the horizon: the read-ahead
# is kept within this factor of the level (a ramp that doubles within a horizon is still followed one interval on)
AHEAD_MAX = 2.0
CORRECTION_MAX = 2.0  # client ITL over engine step time beyond this is not decode's to fix (a starved gateway)


class Holt:
    """Holt's linear trend over one series, one sample per evaluation."""

    def __init__(self, alpha: float = LEVEL_ALPHA, beta: float = TREND_BETA) -> None:
        self.alpha, self.beta = alpha, beta
        self.level: float | None = None
        self.trend = 0.0

    def update(self, y: float) -> None:
        if self.level is None:
            self.level = y
            return
        prev = self.level
        self.level = self.alpha * y + (1 - self.alpha) * (prev + self.trend)
        self.trend = self.beta * (self.level - prev) + (1 - self.beta) * self.trend

    def ahead(self, h: float) -> float | None:
        """The series h samples ahead (never negative); None before the first sample."""
        return None if self.level is None else max(0.0, self.level + h * self.trend)


@dataclass(frozen=True)
class TrafficSample:
    """What the gateways saw over one evaluation interval."""

    interval_s: float
    arrivals_per_s: float
    prompt_tokens: float = 0.0  # mean per finished request (0: none finished)
    answer_tokens: float = 0.0
    itl_s: float | None = None  # mean client-visible time between tokens (None: no tokens streamed)
    ttft_s: float | None = None


@dataclass(frozen=True)
class Forecast:
    """The traffic expected `horizon_s` from now and what each role needs for it (0: not known yet)."""

    horizon_s: float
    arrivals_per_s: float
    prompt_tokens: float
    answer_tokens: float
    prefill_needed: int = 0
    decode_needed: int = 0
    numbers: dict[str, float] = field(default_factory=dict)

    def needed(self, role: str) -> int:
        return self.prefill_needed if role == "prefill" else self.decode_needed

    def why(self, role: str) -> str:
        what = (
            f"{self.prompt_tokens:.0f}-token prompts"
            if role == "prefill"
            else (f"{self.answer_tokens:.0f}-token answers, " if self.answer_tokens else "")
            + f"{self.numbers.get('forecast_streams', 0):.0f} streams"
        )
        return (
            f"forecast {self.arrivals_per_s:.1f} req/s of {what} in {self.horizon_s:.0f} s needs "
            f"{self.needed(role)} {role} instances"
        )


@dataclass(frozen=True)
class Capacity:
    """Per-instance capacities fitted by the load mode (0 / None: not measured yet)."""

    prefill_tokens_per_s: float = 0.0
    itl_line: tuple[float, float] | None = None  # (a s, k s per request) of decode step = a + k x batch
    itl_correction: float = 1.0  # client-visible ITL / engine step time


def size_prefill(arrivals_per_s: float, prompt_tokens: float, cap: Capacity) -> int:
    if cap.prefill_tokens_per_s <= 0 or arrivals_per_s <= 0 or prompt_tokens <= 0:
        return 0
    return max(1, math.ceil(arrivals_per_s * prompt_tokens / (cap.prefill_tokens_per_s * PREFILL_UTIL)))


def size_decode(arrivals_per_s: float, answer_tokens: float, cap: Capacity, aim_s: float) -> int:
    """Decode instances that keep the client-visible ITL at `aim_s` for the forecast arrivals."""
    if arrivals_per_s <= 0 or answer_tokens <= 0:
        return 0
    return size_streams(arrivals_per_s * answer_tokens * aim_s, cap, aim_s)


def size_streams(streams: float, cap: Capacity, aim_s: float) -> int:
    """Decode instances that keep the client-visible ITL at `aim_s` with `streams` requests decoding."""
    if cap.itl_line is None or streams <= 0:
        return 0
    a, k = cap.itl_line
    engine_aim = aim_s / max(1.0, cap.itl_correction)
    if engine_aim <= a:
        # even one stream per instance misses the aim (the target sits at the step-time floor): spreading the
        # streams as thin as the bounds allow comes closest
        return max(1, math.ceil(streams))
    return max(1, math.ceil(k * streams / (engine_aim - a)))


class Forecaster:
    """Holt series of arrival rate, prompt and answer length; `forecast()` sizes both roles `horizon` ahead."""

    def __init__(self) -> None:
        # lengths are smoothed without a trend: a shift of the mix (long prompts to short) read on its trend
        # overshoots below the new length (to 0 tokens, measured on the load ramp) for several intervals
        self.rate, self.streams = Holt(), Holt()
        self.isl, self.osl = Holt(beta=0.0), Holt(beta=0.0)
        self.samples = 0
        self.streams_now = 0.0

    def update_streams(self, streams: float) -> None:
        """Requests decoding or waiting at the decode pool now (once per evaluation)."""
        self.streams.update(streams)
        self.streams_now = streams

    def update(self, s: TrafficSample) -> None:
        self.samples += 1
        self.rate.update(s.arrivals_per_s)
        if s.prompt_tokens > 0:
            self.isl.update(s.prompt_tokens)
        if s.answer_tokens > 0:
            self.osl.update(s.answer_tokens)

    def forecast(self, horizon_s: float, interval_s: float, cap: Capacity, itl_aim_s: float) -> Forecast | None:
        """None until two samples (a trend) exist."""
        if self.samples < 2:
            return None
        h = horizon_s / max(interval_s, 1e-3)
        # the rate is read ahead, and never below its level: a forecast adds instances ahead of a rise but leaves
        # a fall to the load mode, which drains only what its measurements say is idle
        level = self.rate.ahead(0) or 0.0
        rate = min(AHEAD_MAX * level, max(level, self.rate.ahead(h) or 0.0))
        isl, osl = self.isl.ahead(0) or 0.0, self.osl.ahead(0) or 0.0
        # a count, not a noisy rate: read ahead from the latest value on the smoothed trend
        now = self.streams_now
        streams = min(AHEAD_MAX * now, now + max(0.0, h * self.streams.trend))
        nums = {
            "forecast_streams": streams,
            "forecast_req_per_s": rate,
            "rate_level_req_per_s": level,
            "rate_trend_req_per_s2": self.rate.trend / max(interval_s, 1e-3),
            "forecast_prompt_tokens": isl,
            "forecast_answer_tokens": osl,
            "horizon_s": horizon_s,
        }
        decode = max(size_decode(rate, osl, cap, itl_aim_s), size_streams(streams, cap, itl_aim_s))
        return Forecast(horizon_s, rate, isl, osl, size_prefill(rate, isl, cap), decode, nums)
