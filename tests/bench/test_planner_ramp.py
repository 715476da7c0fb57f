"""The planner ramp's reaction measures on synthetic requests and decisions (no cluster)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench.planner_ramp import reaction_intervals, window_reaction_intervals


@dataclass(frozen=True)
class Res:
    success: bool
    ttft_s: float
    tpot_s: float


T0 = 1000.0


def decision(t: float, action: str, reason: str, role: str = "decode") -> dict:  # type: ignore[type-arg]
    return {"role": role, "action": action, "reason": reason, "ts": T0 + t}


def test_one_slow_request_counts_alone_but_not_in_its_interval() -> None:
    # 40 streams in [10, 12) at 60 ms and one at 82 ms: late on its own, not on the interval's average
    res = [(10.0 + i * 0.05, Res(True, 0.2, 0.060)) for i in range(40)] + [(10.5, Res(True, 0.2, 0.082))]
    decisions = [decision(0.0, "hold", "estimated ITL 60 ms within target 80 ms"), decision(30.0, "scale_up", "x")]
    per_request = reaction_intervals(res, decisions, T0, 2.0, 3000.0, 80.0)
    per_interval = window_reaction_intervals(res, decisions, T0, 2.0, 3000.0, 80.0)
    assert per_request["decode"] == pytest.approx((30.0 - (10.5 + 0.2 + 0.16)) / 2.0)
    assert per_interval["decode"] is None  # no interval was late


def test_a_late_interval_is_timed_to_the_planners_response() -> None:
    res = [(20.0 + i * 0.1, Res(True, 0.1, 0.120)) for i in range(10)]  # first tokens in [20, 22): all late
    decisions = [
        decision(0.0, "hold", "estimated ITL 60 ms within target 80 ms"),
        decision(25.0, "hold", "estimated ITL 120 ms > target 80 ms; scale-up cooldown (2 s of 4 s)"),
    ]
    got = window_reaction_intervals(res, decisions, T0, 2.0, 3000.0, 80.0)
    assert got["decode"] == pytest.approx((25.0 - (22.0 + 0.16)) / 2.0)
    # already acting when it became observable: 0
    early = [decision(0.0, "scale_up", "estimated ITL 90 ms > target 80 ms: 1 -> 2")]
    assert window_reaction_intervals(res, early, T0, 2.0, 3000.0, 80.0)["decode"] == 0.0
    # prefill: arrivals in [40, 42) waiting 5 s for a 3 s target, a scale-up at 50 s
    slow = [(40.0 + i * 0.2, Res(True, 5.0, 0.05)) for i in range(10)]
    ups = [decision(50.0, "scale_up", "estimated TTFT 5000 ms > target 3000 ms", role="prefill")]
    assert window_reaction_intervals(slow, ups, T0, 2.0, 3000.0, 80.0)["prefill"] == pytest.approx(
        (50.0 - (42.0 + 3.0)) / 2.0
    )
