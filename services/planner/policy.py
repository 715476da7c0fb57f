"""The planner's policy: from each role's estimate to a decision, within bounds, cooldowns, budget and pins.

    scale up    a role whose estimate breaks its target (or that is under pressure: queueing, KV pages out),
                to the size the load needs: at least +1, at most +max_scale_step, never above its maximum,
                never past the cooldown since its last scale-up, and within the budget (the role breaking its
                target by more gets the room first)
    scale down  a role whose estimate with one instance fewer stays under (1 - hysteresis) x target and (prefill)
                whose remaining instances would be busy less than idle_threshold; one instance at a time (the idlest
                is drained), never below the minimum, never within scale_down_cooldown_s of any change of it,
                never while some of its instances are still starting
    pinned      an operator scaled the role by hand: no decision for it until the pin ends
    retry       a failed scale-up waits a backoff (doubling up to scale_retry_max_s), and the role does not scale
                down meanwhile: a refused start never turns into flapping

    forecast    (throughput mode, services/planner/forecast.py) a role the traffic forecast `horizon` ahead needs
                more instances for scales up before its target breaks (same bounds, cooldown and budget; it yields
                the budget to a measured breach), and no role scales down below what the forecast needs

Pure: `decide(views, memory, limits, now)` returns decisions and touches nothing but `memory` (what estimation
learned, the recent loads) and the forecaster it is given.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.planner.estimate import Estimate, InstanceLoad, Learned, estimate_decode, estimate_prefill
from services.planner.forecast import Capacity, Forecast, Forecaster
from shared.cluster.bus.planner import Action

if TYPE_CHECKING:
    from shared.config.groups import PlannerConfig


class ScaledRole(enum.StrEnum):
    """The roles the planner scales (a subset of shared.config.roles.Role, with the same values)."""

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class Limits:
    ttft_target_s: float
    itl_target_s: float
    min_count: dict[ScaledRole, int]
    max_count: dict[ScaledRole, int]
    budget: int
    scale_up_cooldown_s: float = 10.0
    scale_down_cooldown_s: float = 30.0
    hysteresis: float = 0.3
    idle_threshold: float = 0.5
    max_scale_step: int = 2

    @classmethod
    def from_config(cls, c: PlannerConfig) -> Limits:
        """From a PlannerConfig (shared/config/groups.py)."""
        mins = {ScaledRole.PREFILL: c.min_prefill, ScaledRole.DECODE: c.min_decode}
        maxs = {ScaledRole.PREFILL: c.max_prefill, ScaledRole.DECODE: c.max_decode}
        return cls(
            ttft_target_s=c.ttft_target_ms / 1e3,
            itl_target_s=c.itl_target_ms / 1e3,
            min_count=mins,
            max_count=maxs,
            budget=c.budget or sum(maxs.values()),
            scale_up_cooldown_s=c.scale_up_cooldown_s,
            scale_down_cooldown_s=c.scale_down_cooldown_s,
            hysteresis=c.hysteresis,
            idle_threshold=c.idle_threshold,
            max_scale_step=c.max_scale_step,
        )

    def target_s(self, role: ScaledRole) -> float:
        return self.ttft_target_s if role == ScaledRole.PREFILL else self.itl_target_s


@dataclass(frozen=True)
class RoleView:
    """One role as the planner sees it now."""

    role: ScaledRole
    current: int  # instances it has or is getting (ready + starting, or what the actuator was told)
    loads: tuple[InstanceLoad, ...]  # ready instances with a fresh load report
    starting: int = 0
    ready: int | None = None  # ready instances, reporting or not (None: as many as loads)


@dataclass
class RoleMemory:
    """What the planner remembers about a role between evaluations."""

    last_up: float = float("-inf")
    last_change: float = float("-inf")
    pin: int | None = None  # the count an operator set by hand
    pin_until: float = float("inf")
    failures: int = 0
    retry_at: float = float("-inf")
    learned: Learned = field(default_factory=Learned)
    loads: deque[tuple[float, float]] = field(default_factory=deque)  # (when, Estimate.load) of recent evaluations


@dataclass(frozen=True)
class Plan:
    role: ScaledRole
    action: Action
    current: int
    target: int
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)
    drain: tuple[str, ...] = ()
    severity: float = 0.0  # estimate / target of a scale-up (who gets the budget first)
    estimate: Estimate | None = None
    loads: tuple[InstanceLoad, ...] = ()


# A forecast scale-up is less urgent than a measured breach (> 1: estimate / target, >= 1.5 with queueing): the
# other role gives it only instances it can spare staying calm (under (1 - hysteresis) of its headroom).
FORECAST_SEVERITY = 1.0


@dataclass(frozen=True)
class Outlook:
    """The throughput mode's inputs: the forecaster (updated by the caller with the last traffic sample), how far
    ahead to size (how long a new instance takes to serve), and the client-visible ITL and TTFT of the last
    interval."""

    forecaster: Forecaster
    horizon_s: float
    interval_s: float
    client_itl_s: float | None = None
    client_ttft_s: float | None = None


def _estimate(view: RoleView, mem: RoleMemory, limits: Limits, outlook: Outlook | None = None) -> Estimate:
    if view.role == ScaledRole.PREFILL:
        ttft = outlook.client_ttft_s if outlook is not None else None
        return estimate_prefill(view.loads, view.current, mem.learned, limits.ttft_target_s, ttft)
    itl = outlook.client_itl_s if outlook is not None else None
    return estimate_decode(view.loads, view.current, mem.learned, limits.itl_target_s, limits.hysteresis, itl)


def forecast_for(outlook: Outlook, memory: dict[ScaledRole, RoleMemory], limits: Limits) -> Forecast | None:
    """Both roles' sizes for the forecast traffic, with the capacities the estimates fitted."""
    p, d = memory[ScaledRole.PREFILL].learned, memory[ScaledRole.DECODE].learned
    cap = Capacity(p.prefill_rate, d.itl_line, d.itl_correction)
    return outlook.forecaster.forecast(
        outlook.horizon_s, outlook.interval_s, cap, limits.itl_target_s * (1 - limits.hysteresis / 2)
    )


def _what(role: ScaledRole) -> str:
    return "TTFT" if role == ScaledRole.PREFILL else "ITL"


@dataclass(frozen=True)
class _Evaluation:
    """One role's evaluation: what plan_role's branches read, and how each words its Plan."""

    view: RoleView
    mem: RoleMemory
    limits: Limits
    now: float
    est: Estimate
    numbers: dict[str, float]
    ahead: int  # instances the forecast needs (0 without a forecast)
    peak: float  # the largest load of the last scale-down cooldown

    @property
    def role(self) -> ScaledRole:
        return self.view.role

    @property
    def n(self) -> int:
        return self.view.current

    @property
    def target(self) -> float:
        return self.limits.target_s(self.view.role)

    @property
    def hi(self) -> int:
        return self.limits.max_count[self.view.role]

    def plan(self, action: Action, to: int, reason: str, *, drain: tuple[str, ...] = (), severity: float = 0.0) -> Plan:
        return Plan(
            self.role,
            action,
            self.n,
            to,
            reason,
            self.numbers,
            drain,
            severity,
            estimate=self.est,
            loads=self.view.loads,
        )


def plan_role(
    view: RoleView,
    mem: RoleMemory,
    limits: Limits,
    now: float,
    est: Estimate | None = None,
    forecast: Forecast | None = None,
) -> Plan:
    """The role's plan on its own (decide() then trims scale-ups to the budget): pinned, below the minimum, a
    breach or pressure, the forecast, a scale-down, or a hold, the first that applies."""
    role, n = view.role, view.current
    est = _estimate(view, mem, limits) if est is None else est
    ev = _Evaluation(
        view,
        mem,
        limits,
        now,
        est,
        _numbers(view, est, limits.target_s(role), forecast),
        forecast.needed(role) if forecast is not None else 0,
        _record_peak(mem, est, limits, now),
    )
    target, lo = ev.target, limits.min_count[role]
    if mem.pin is not None and now < mem.pin_until:
        return ev.plan(
            Action.PINNED,
            mem.pin,
            f"pinned at {mem.pin} by a manual scale; `pdrelay planner unpin {role}` hands it back",
        )
    if n < lo:
        return ev.plan(Action.SCALE_UP, lo, f"{n} {role} instances, below --min-{role} {lo}", severity=float("inf"))
    if est.now_s is not None and est.now_s > target:
        return _scale_up(ev, f"estimated {_what(role)} {est.now_s * 1e3:.0f} ms > target {target * 1e3:.0f} ms")
    if est.pressure:
        return _scale_up(ev, est.pressure)
    if (
        forecast is not None
        and ev.ahead > n
        and n < ev.hi
        and now >= mem.retry_at
        and now - mem.last_up >= limits.scale_up_cooldown_s
    ):
        to = min(ev.hi, n + limits.max_scale_step, ev.ahead)
        return ev.plan(
            Action.SCALE_UP,
            to,
            f"{forecast.why(role)}: {n} -> {to} ahead of the load (now: {_now_text(est, role, target)})",
            severity=FORECAST_SEVERITY,
        )
    down = _scale_down(ev)
    if down is not None:
        return down
    if est.now_s is None:
        return ev.plan(Action.HOLD, n, f"no {_what(role)} measurement yet")
    return ev.plan(
        Action.HOLD, n, f"estimated {_what(role)} {est.now_s * 1e3:.0f} ms within target {target * 1e3:.0f} ms"
    )


def _numbers(view: RoleView, est: Estimate, target: float, forecast: Forecast | None) -> dict[str, float]:
    """The figures a plan reports: the estimate's, the target and sizes, and the forecast's."""
    nums = {**est.numbers, "target_ms": target * 1e3, "instances": float(view.current), "ready": float(len(view.loads))}
    if forecast is not None:
        nums.update(forecast.numbers)
        nums["forecast_needed"] = float(forecast.needed(view.role))
    return nums


def _record_peak(mem: RoleMemory, est: Estimate, limits: Limits, now: float) -> float:
    """Records this evaluation's load and returns the peak of the last scale-down cooldown.

    The load a scale-down must carry is that peak, not the present one (like Kubernetes' downscale stabilization
    window), so every evaluation records it, a breach's included: measured on the load ramp at a steady 5 req/s,
    decode drained 5 -> 4 -> 3 on momentary dips of its streams and breached ITL until it had scaled back up."""
    mem.loads.append((now, est.load))
    while mem.loads and mem.loads[0][0] < now - limits.scale_down_cooldown_s:
        mem.loads.popleft()
    return max(x for _, x in mem.loads)


def _scale_up(ev: _Evaluation, why: str) -> Plan:
    """A breach or pressure: grow to what the load (or the forecast) needs, unless a retry, the maximum or the
    cooldown holds it."""
    n, mem, limits, now, est = ev.n, ev.mem, ev.limits, ev.now, ev.est
    if now < mem.retry_at:
        return ev.plan(Action.HOLD, n, f"{why}; retrying the failed scale-up in {mem.retry_at - now:.0f} s")
    if n >= ev.hi:
        return ev.plan(Action.HOLD, n, f"{why}; already at --max-{ev.role} {ev.hi}")
    if now - mem.last_up < limits.scale_up_cooldown_s:
        return ev.plan(
            Action.HOLD,
            n,
            f"{why}; scale-up cooldown ({now - mem.last_up:.0f} s of {limits.scale_up_cooldown_s:.0f} s)",
        )
    to = min(ev.hi, n + limits.max_scale_step, max(n + 1, est.needed, ev.ahead))
    severity = (est.now_s / ev.target) if est.now_s is not None else 1.0
    if est.pressure:  # queueing or out of KV pages: as urgent as a breach
        severity = max(severity, 1.5)
    return ev.plan(Action.SCALE_UP, to, f"{why}: {n} -> {to} (the load needs {est.needed})", severity=severity)


def _scale_down(ev: _Evaluation) -> Plan | None:
    """Drain one instance when one fewer stays calm at the recent peak (and, for prefill, idle enough), or say
    what holds it; None when one fewer would not do."""
    role, n, mem, limits, now, est = ev.role, ev.n, ev.mem, ev.limits, ev.now, ev.est
    if not (n > max(limits.min_count[role], 1) and est.fewer_s is not None and n > max(est.needed, ev.ahead)):
        return None
    calm = est.calm(n - 1, ev.target, limits.hysteresis, ev.peak)
    # A decode instance is "busy" whenever it holds one request: its ITL says more than its busy share.
    idle = role == ScaledRole.DECODE or est.util / (n - 1) <= limits.idle_threshold
    if not (calm and idle):
        return None
    silent = (ev.view.ready if ev.view.ready is not None else len(ev.view.loads)) - len(ev.view.loads)
    if silent > 0:  # a busy engine can delay its reports: missing numbers are not an idle instance
        return ev.plan(Action.HOLD, n, f"could drain one, but {silent} ready instances sent no recent load report")
    if ev.view.starting:
        return ev.plan(Action.HOLD, n, f"could drain one, but {ev.view.starting} instances are still starting")
    if now - mem.last_change < limits.scale_down_cooldown_s:
        return ev.plan(
            Action.HOLD,
            n,
            f"could drain one; scale-down cooldown ({now - mem.last_change:.0f} s "
            f"of {limits.scale_down_cooldown_s:.0f} s)",
        )
    if now < mem.retry_at:
        return ev.plan(Action.HOLD, n, "could drain one, but a failed scale-up is being retried")
    drain = _idlest(ev.view.loads, 1)
    busy = (
        f" and they would be busy {est.util / (n - 1):.0%} (<= {limits.idle_threshold:.0%})"
        if role == ScaledRole.PREFILL
        else ""
    )
    return ev.plan(
        Action.SCALE_DOWN,
        n - 1,
        f"with {n - 1} instances the estimated {_what(role)} is {est.fewer_s * 1e3:.0f} ms"
        f"{_at_peak(est, n - 1, ev.peak, limits.scale_down_cooldown_s)}, "
        f"{limits.hysteresis:.0%} of the headroom under the target{busy}: draining "
        f"{', '.join(drain) or 'one'}",
        drain=drain,
    )


def _at_peak(est: Estimate, m: int, peak: float, window_s: float) -> str:
    got = est.at_load(m, peak) if peak > est.load else None
    return "" if got is None else f" ({got * 1e3:.0f} ms at the peak load of the last {window_s:.0f} s)"


def _now_text(est: Estimate, role: ScaledRole, target: float) -> str:
    if est.now_s is None:
        return f"no {_what(role)} measurement yet"
    return f"estimated {_what(role)} {est.now_s * 1e3:.0f} ms, target {target * 1e3:.0f} ms"


def _idlest(loads: tuple[InstanceLoad, ...], k: int) -> tuple[str, ...]:
    order = sorted(loads, key=lambda x: (x.running + x.queued, x.pending_prefill_tokens, x.busy, x.instance_id))
    return tuple(x.instance_id for x in order[:k])


def _rebalance(up: Plan, donor: Plan, limits: Limits, want: int) -> Plan | None:
    """The budget blocks `up` by `want` instances: take up to that many from `donor` if it can spare them. No
    cooldown: the budget moves to where the load is.

    The donor never goes below what its own forecast needs (its load coming back). For a forecast, it gives only
    what leaves it calm (Estimate.calm: under (1 - hysteresis) of its headroom), for a measured breach whatever
    leaves it within its target: a stream that breaks its ITL now is lost for sure, a donor at its target is not."""
    est, target = donor.estimate, limits.target_s(donor.role)
    if est is None or donor.action not in (Action.HOLD, Action.SCALE_DOWN):
        return None
    lo, n = max(limits.min_count[donor.role], 1), donor.current
    # Measured on the load ramp (bench/RESULTS.md, "Planner"): without its forecast as a floor, two forecasts
    # that each needed more than the budget traded one instance back and forth (decode 5 -> 4 -> 5 and prefill
    # 1 -> 2 -> 1 three times in 15 s, every swap a drain and a start); a donor held to "calm" when the other role
    # breached left decode at one instance for 4 s of breaching streams while prefill's backlog was within target.
    lo = max(lo, int(donor.numbers.get("forecast_needed", 0)))
    measured = up.severity > FORECAST_SEVERITY
    already = n - donor.target  # a donor scaling down on its own gives that much anyway
    want += already
    give = 0
    while give < want and n - give - 1 >= lo:
        m = n - give - 1
        if measured:
            after = est.at(m)
            if after is None or after > target:
                break
        elif not est.calm(m, target, limits.hysteresis):
            break
        elif donor.role == ScaledRole.PREFILL and est.util / m > limits.idle_threshold:
            break  # (for a measured breach the estimate within the target already counts the pending prompts)
        give += 1
    if give <= already:
        return None
    drain = _idlest(donor.loads, give)
    after_s = est.at(n - give)
    assert after_s is not None  # give >= 1 and the loop above accepted n - give
    return Plan(
        donor.role,
        Action.SCALE_DOWN,
        n,
        n - give,
        f"{up.role} needs the budget ({up.reason.split(':')[0]}); with {n - give} instances {donor.role}'s "
        f"estimated {_what(donor.role)} is {after_s * 1e3:.0f} ms, within its target of {target * 1e3:.0f} "
        f"ms: draining {', '.join(drain)}",
        donor.numbers,
        drain,
        estimate=est,
        loads=donor.loads,
    )


def decide(
    views: dict[ScaledRole, RoleView],
    memory: dict[ScaledRole, RoleMemory],
    limits: Limits,
    now: float,
    outlook: Outlook | None = None,
) -> list[Plan]:
    """One evaluation: a plan per role, scale-ups trimmed to the budget (the worse breach first); a scale-up the
    budget blocks takes instances from the other role when that one can spare them. With an outlook, the
    forecast (sized with this evaluation's fitted capacities) scales roles up ahead of the load."""
    if outlook is not None and ScaledRole.DECODE in views:
        outlook.forecaster.update_streams(float(sum(x.running + x.queued for x in views[ScaledRole.DECODE].loads)))
    ests = {role: _estimate(view, memory[role], limits, outlook) for role, view in views.items()}
    fc = forecast_for(outlook, memory, limits) if outlook is not None and len(memory) == len(ScaledRole) else None
    plans = {role: plan_role(view, memory[role], limits, now, ests[role], fc) for role, view in views.items()}
    # a role scaling down frees its instances for the other one in the same evaluation
    total = sum(p.target for p in plans.values())
    for p in sorted((p for p in plans.values() if p.action == Action.SCALE_UP), key=lambda p: p.severity):
        if total <= limits.budget:
            break
        short = total - limits.budget
        donor_role = next((r for r in plans if r != p.role), None)
        if donor_role is not None:
            given = _rebalance(p, plans[donor_role], limits, short)
            if given is not None:
                total -= plans[donor_role].target - given.target
                plans[donor_role] = given
                short = total - limits.budget
                if short <= 0:
                    continue
        room = max(p.current, p.target - short)
        total -= p.target - room
        if room <= p.current:
            plans[p.role] = Plan(
                p.role,
                Action.HOLD,
                p.current,
                p.current,
                f"{p.reason}; held: the budget of {limits.budget} instances is used up",
                p.numbers,
                estimate=p.estimate,
                loads=p.loads,
            )
        else:
            plans[p.role] = Plan(
                p.role,
                p.action,
                p.current,
                room,
                f"{p.reason}; capped at {room} by the budget of {limits.budget}",
                p.numbers,
                severity=p.severity,
                estimate=p.estimate,
                loads=p.loads,
            )
    return [plans[r] for r in views]
