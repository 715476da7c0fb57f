"""The planner's policy and estimates, without processes: plain numbers in, decisions out."""

from __future__ import annotations

import dataclasses

import pytest

from services.planner.estimate import InstanceLoad
from services.planner.policy import (
    FORECAST_SEVERITY,
    Limits,
    Plan,
    RoleMemory,
    RoleView,
    ScaledRole,
    _rebalance,
    decide,
    plan_role,
)
from shared.cluster.bus.planner import Action

P, D = ScaledRole.PREFILL, ScaledRole.DECODE


def limits(**kw) -> Limits:
    base = dict(
        ttft_target_s=1.0,
        itl_target_s=0.1,
        min_count={P: 1, D: 1},
        max_count={P: 6, D: 6},
        budget=8,
        scale_up_cooldown_s=10,
        scale_down_cooldown_s=30,
        hysteresis=0.3,
        idle_threshold=0.5,
        max_scale_step=2,
    )
    base.update(kw)
    return Limits(**base)


def prefill(n: int, pending: int, *, rate: float = 1000.0, busy: float = 0.5, step_ms: float = 100.0) -> RoleView:
    loads = tuple(
        InstanceLoad(
            f"p{i}", pending_prefill_tokens=pending // n, compute_tokens_per_s=rate, busy=busy, step_ms=step_ms
        )
        for i in range(n)
    )
    return RoleView(P, n, loads)


def decode(n: int, running: int, step_ms: float, *, queued: int = 0, busy: float = 1.0) -> RoleView:
    loads = tuple(
        InstanceLoad(
            f"d{i}", running=running // n, queued=queued, step_ms=step_ms, busy=busy, free_pages=500, total_pages=1000
        )
        for i in range(n)
    )
    return RoleView(D, n, loads)


def test_prefill_scales_up_when_queued_prompts_break_the_ttft_target() -> None:
    # 2 instances, 6000 tokens pending at 1000 tok/s each: 3 s + one step > 1 s target
    p = plan_role(prefill(2, 6000), RoleMemory(), limits(), now=100)
    assert p.action == Action.SCALE_UP and p.target == 4  # needs 7, but +2 at most per decision
    assert p.numbers["est_ttft_ms"] == pytest.approx(3100)
    assert "3100 ms > target 1000 ms" in p.reason


def test_prefill_holds_within_the_target_and_scales_down_when_idle() -> None:
    assert plan_role(prefill(2, 800, busy=0.5), RoleMemory(), limits(), now=100).action == Action.HOLD
    p = plan_role(prefill(3, 0, busy=0.1), RoleMemory(), limits(), now=100)
    assert p.action == Action.SCALE_DOWN and p.target == 2 and p.drain == ("p0",)


def test_scale_down_needs_the_cooldown_and_hysteresis() -> None:
    mem = RoleMemory(last_change=90)
    p = plan_role(prefill(3, 0, busy=0.1), mem, limits(), now=100)
    assert p.action == Action.HOLD and "cooldown" in p.reason
    # with one fewer the estimate would be 0.6 + 0.1 s = 0.7 s: under the target but not under 70 % of it
    p = plan_role(prefill(3, 2400, busy=0.1), RoleMemory(), limits(), now=100)
    assert p.action == Action.HOLD


def test_never_below_the_minimum_and_up_to_it_first() -> None:
    assert plan_role(prefill(1, 0, busy=0.0), RoleMemory(), limits(), now=100).action == Action.HOLD
    p = plan_role(RoleView(D, 0, ()), RoleMemory(), limits(min_count={P: 1, D: 2}), now=100)
    assert p.action == Action.SCALE_UP and p.target == 2


def test_scale_up_respects_cooldown_maximum_and_retry_backoff() -> None:
    view = prefill(2, 6000)
    assert "cooldown" in plan_role(view, RoleMemory(last_up=95), limits(), 100).reason
    assert "--max-prefill 2" in plan_role(view, RoleMemory(), limits(max_count={P: 2, D: 6}), 100).reason
    held = plan_role(view, RoleMemory(retry_at=110), limits(), 100)
    assert held.action == Action.HOLD and "retrying" in held.reason
    # and no scale-down while a failed scale-up waits for its retry
    idle = plan_role(prefill(3, 0, busy=0.1), RoleMemory(retry_at=110), limits(), 100)
    assert idle.action == Action.HOLD


def test_a_pin_freezes_the_role() -> None:
    p = plan_role(prefill(2, 6000), RoleMemory(pin=2), limits(), 100)
    assert p.action == Action.PINNED and p.target == 2
    assert plan_role(prefill(2, 6000), RoleMemory(pin=2, pin_until=50), limits(), 100).action == Action.SCALE_UP


def test_decode_regression_predicts_itl_from_the_batch() -> None:
    mem = RoleMemory()
    # step = 20 ms + 5 ms per running request: learned from two batch sizes
    plan_role(decode(1, 4, 40.0), mem, limits(), 0)
    p = plan_role(decode(1, 20, 120.0), mem, limits(), 1)
    assert p.numbers["itl_fit_per_request_ms"] == pytest.approx(5.0)
    assert p.numbers["itl_fit_base_ms"] == pytest.approx(20.0)
    assert p.action == Action.SCALE_UP and p.target == 2  # 120 ms > 100 ms; 2 instances bring it to 70 ms
    # at 2 instances and 8 requests, one instance alone would run 20 + 5 x 8 = 60 ms <= 70 % of 100 ms
    down = plan_role(decode(2, 8, 40.0, busy=0.3), mem, limits(), 100)
    assert down.action == Action.SCALE_DOWN and down.numbers["est_itl_fewer_ms"] == pytest.approx(60.0)


def test_decode_waiting_requests_are_pressure_even_with_a_good_itl() -> None:
    p = plan_role(decode(2, 8, 30.0, queued=3), RoleMemory(), limits(), 100)
    assert p.action == Action.SCALE_UP and "wait for admission" in p.reason


def test_budget_goes_to_the_worse_breach_first() -> None:
    views = {P: prefill(3, 30000), D: decode(3, 30, 150.0)}  # TTFT 10x its target, ITL 1.5x
    plans = {p.role: p for p in decide(views, {P: RoleMemory(), D: RoleMemory()}, limits(budget=7), 100)}
    assert plans[P].action == Action.SCALE_UP and plans[P].target == 4
    assert plans[D].action == Action.HOLD and "budget" in plans[D].reason
    assert sum(p.target for p in plans.values()) <= 7


def test_a_blocked_scale_up_takes_the_budget_from_a_calm_role() -> None:
    # decode: 5 instances, idle-ish (ITL 20 ms, target 100 ms); prefill breaks TTFT but the budget (6) is used up
    mem = {P: RoleMemory(), D: RoleMemory()}
    mem[D].learned.itl_points.extend([(1.0, 0.015), (8.0, 0.050)])  # 10 ms + 5 ms per request
    views = {P: prefill(1, 6000), D: decode(5, 5, 20.0)}
    plans = {p.role: p for p in decide(views, mem, limits(budget=6), 100)}
    assert plans[P].action == Action.SCALE_UP and plans[P].target == 3
    assert plans[D].action == Action.SCALE_DOWN and plans[D].target == 3 and len(plans[D].drain) == 2
    assert "prefill needs the budget" in plans[D].reason
    assert sum(p.target for p in plans.values()) <= 6


def test_a_measured_breach_takes_a_donor_down_to_its_target() -> None:
    # decode: 16 streams at 10 ms + 5 ms per request; one instance would run ~90 ms, inside the 100 ms target but
    # not calm: for a measured TTFT breach it gives all but one (a stream breaking ITL is lost, one at 90 ms is not)
    mem = {P: RoleMemory(), D: RoleMemory()}
    mem[D].learned.itl_points.extend([(1.0, 0.015), (8.0, 0.050)])
    views = {P: prefill(1, 30000), D: decode(4, 16, 30.0)}
    plans = {p.role: p for p in decide(views, mem, limits(budget=4), 100)}  # prefill wants 3 of the 4
    assert plans[D].action == Action.SCALE_DOWN and plans[D].target == 1
    assert plans[P].action == Action.SCALE_UP and plans[P].target == 3
    # 24 streams: one instance would run 130 ms, two 70 ms: it keeps two
    views = {P: prefill(1, 30000), D: decode(4, 24, 40.0)}
    mem = {P: RoleMemory(), D: RoleMemory()}
    mem[D].learned.itl_points.extend([(1.0, 0.015), (8.0, 0.050)])
    plans = {p.role: p for p in decide(views, mem, limits(budget=4), 100)}
    assert plans[D].target == 2 and plans[P].target == 2


def test_a_donor_keeps_what_its_own_forecast_needs() -> None:
    mem = RoleMemory()
    mem.learned.itl_points.extend([(1.0, 0.015), (8.0, 0.050)])
    idle = plan_role(decode(4, 4, 15.0), mem, limits(), 100)  # 3 instances would be calm: it would drain one
    donor = dataclasses.replace(idle, action=Action.HOLD, target=4, numbers={**idle.numbers, "forecast_needed": 3.0})
    breach = Plan(P, Action.SCALE_UP, 1, 4, "estimated TTFT 30000 ms > target 1000 ms", severity=30.0)
    given = _rebalance(breach, donor, limits(), 3)
    assert given is not None and given.target == 3  # idle now, but its forecast needs 3
    forecast = dataclasses.replace(breach, severity=FORECAST_SEVERITY, reason="forecast ...")
    assert _rebalance(forecast, dataclasses.replace(donor, numbers={**donor.numbers, "forecast_needed": 4.0}),
                      limits(), 3) is None  # fmt: skip
    mine = _rebalance(forecast, donor, limits(), 3)
    assert mine is not None and mine.target == 3


def test_a_scale_down_carries_the_peak_load_of_its_cooldown_window() -> None:
    mem = RoleMemory()
    mem.learned.itl_points.extend([(1.0, 0.015), (8.0, 0.050)])  # 10 ms + 5 ms per request, target 100 ms
    lim = limits(scale_down_cooldown_s=10)
    assert plan_role(decode(4, 40, 60.0), mem, lim, 100).action == Action.HOLD  # 3 instances: 77 ms, not calm
    dip = plan_role(decode(4, 16, 30.0), mem, lim, 105)  # a momentary dip: 3 instances would be calm now
    assert dip.action == Action.HOLD
    later = plan_role(decode(4, 16, 30.0), mem, lim, 111)  # the peak has left the window
    assert later.action == Action.SCALE_DOWN and later.target == 3
    # a breach's load counts too: 80 streams (110 ms) at t = 200, a dip at 205 drains nothing
    assert plan_role(decode(4, 80, 110.0), mem, lim, 200).action == Action.SCALE_UP
    assert plan_role(decode(4, 16, 30.0), mem, lim, 205).action == Action.HOLD


def test_missing_load_reports_are_not_read_as_idle() -> None:
    view = prefill(3, 0, busy=0.1)
    silent = RoleView(P, 3, view.loads[:1], ready=3)  # two ready instances did not report lately
    p = plan_role(silent, RoleMemory(), limits(), now=100)
    assert p.action == Action.HOLD and "no recent load report" in p.reason
