"""The planner service: every --evaluation-interval-s the leading planner reads the cluster (etcd membership,
NATS load reports), asks the policy what each role should become, and has the actuator do it. Every decision
is logged, published on NATS (`pdrelay planner log --follow`) and kept for `pdrelay planner log`.

Each evaluation also scrapes the gateways' /metrics (services/planner/traffic.py) for the throughput mode's
forecast (services/planner/forecast.py); without a reachable gateway the planner runs in load mode alone.

Several planners may run: one leads (an etcd key under its lease, services/planner/leader.py), the others stand
by and take over when its lease dies. A planner that stops or dies changes nothing: the cluster keeps its size.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from typing import Any

from prometheus_client import Counter, Gauge

from services.planner.actuators.base import Actuator, DrainTarget, ScaleError
from services.planner.estimate import InstanceLoad
from services.planner.forecast import Forecaster
from services.planner.leader import LeaderElection
from services.planner.policy import Limits, Outlook, Plan, RoleMemory, RoleView, ScaledRole, decide
from services.planner.traffic import GatewayScraper
from shared.cluster.bus.admin_auth import AdminAuth
from shared.cluster.bus.client import Bus
from shared.cluster.bus.load import LoadTable
from shared.cluster.bus.planner import (
    Action,
    ControlKind,
    Decision,
    PlannerControl,
    PlannerReply,
    publish_decision,
    serve_control,
)
from shared.cluster.instance import InstanceInfo, InstanceState
from shared.cluster.membership import Membership
from shared.config.choices import PlannerActuator
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role
from shared.service import Service, ServiceConfig, ServiceOptions

log = logging.getLogger(__name__)

ROLES = (ScaledRole.PREFILL, ScaledRole.DECODE)


def build_actuator(cfg: ResolvedConfig, bus: Bus, cluster: str, auth: AdminAuth | None = None) -> Actuator:
    p = cfg.planner
    if p.actuator == PlannerActuator.KUBERNETES:
        from services.planner.actuators.k8s import KubernetesActuator, parse_deployments

        return KubernetesActuator(parse_deployments(p.k8s_deployments), p.k8s_namespace)
    from services.planner.actuators.local import LocalActuator

    return LocalActuator(bus, cluster, auth=auth)


class PlannerService(Service):
    role = Role.PLANNER

    def __init__(
        self, cfg: ResolvedConfig, options: ServiceOptions = ServiceOptions(), actuator: Actuator | None = None
    ) -> None:
        super().__init__(ServiceConfig.of(cfg), options)
        self.cfg = cfg
        self.pcfg = cfg.planner
        self.limits = Limits.from_config(self.pcfg)
        if self.pcfg.actuator == PlannerActuator.KUBERNETES:
            from services.planner.actuators.k8s import parse_deployments

            parse_deployments(self.pcfg.k8s_deployments)  # a malformed flag fails at start, not at the first scale
        self._actuator = actuator
        self.memory = {r: RoleMemory() for r in ROLES}
        self.decisions: deque[Decision] = deque(maxlen=self.pcfg.planner_log_size)
        self._seq = 0
        self._last_kind: dict[ScaledRole, str] = {}
        self._expect: dict[ScaledRole, tuple[int, float, float]] = {}  # role -> (count being started, deadline, since)
        # throughput mode: the gateways' traffic, forecast as far ahead as a new instance takes to start serving
        self.forecaster = Forecaster()
        self.scraper: GatewayScraper | None = None
        self.start_s = 2 * self.pcfg.evaluation_interval_s  # learned from the scale-ups seen
        self.members: Membership | None = None
        self.loads = LoadTable()
        self.election: LeaderElection | None = None
        self._loop: asyncio.Task[None] | None = None
        r = self.telemetry.metrics.registry
        self._m_decisions = Counter(
            "pdrelay:planner_decisions", "Planner decisions by role and action", ("role", "action"), registry=r
        )
        self._m_leader = Gauge("pdrelay:planner_leader", "1 while this planner leads", registry=r)
        self._m_target = Gauge(
            "pdrelay:planner_target_instances", "Instances the planner wants per role", ("role",), registry=r
        )
        self._m_estimate = Gauge(
            "pdrelay:planner_estimate_ms", "Estimated TTFT (prefill) / ITL (decode)", ("role",), registry=r
        )

    # ---- lifecycle hooks ---------------------------------------------------------------------------------------
    def load_snapshot(self) -> None:
        return None  # the planner serves no requests: no load reports

    async def warm_up(self) -> None:
        assert self.etcd is not None and self.bus is not None and self.registrar is not None
        self.members = Membership(self.etcd, self.cluster)
        await self.members.start()
        await self.loads.subscribe(self.bus, self.cluster)
        self.scraper = GatewayScraper()
        if self._actuator is None:
            self._actuator = build_actuator(self.cfg, self.bus, self.cluster, self.admin_auth)
        try:
            await self._actuator.start()
        except ScaleError as e:
            from shared.cluster.errors import StartupError

            raise StartupError(str(e)) from None
        registrar = self.registrar
        self.election = LeaderElection(self.etcd, self.cluster, self.instance_id, lambda: registrar.lease_id)
        await serve_control(self.bus, self.cluster, self._on_control)
        self._loop = asyncio.create_task(self._run_loop(), name="planner-loop")

    async def on_draining(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
        if self.election is not None:
            await self.election.resign()
        self._m_leader.set(0)

    async def on_stop(self) -> None:
        await self.loads.close()
        if self.members is not None:
            await self.members.close()
        if self._actuator is not None:
            await self._actuator.close()
        if self.scraper is not None:
            await self.scraper.close()

    # ---- the loop ----------------------------------------------------------------------------------------------
    async def _run_loop(self) -> None:
        interval = self.pcfg.evaluation_interval_s
        # One interval of membership and load reports before the first verdict: deciding on an empty view
        # would "scale up" roles whose instances simply were not seen yet.
        await asyncio.sleep(interval)
        while True:
            started = time.monotonic()
            try:
                await self.evaluate()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad evaluation must not end the planner
                log.exception("%s: evaluation failed", self.instance_id)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def evaluate(self, now: float | None = None) -> list[Decision]:
        """One evaluation (leader only); returns the decisions published."""
        assert self.election is not None and self._actuator is not None
        leading = await self.election.check()
        self._m_leader.set(1 if leading else 0)
        if not leading:
            return []
        now = time.monotonic() if now is None else now
        out: list[Decision] = []
        await self._actuator.refresh()
        for role_name, count in self._actuator.take_manual().items():
            if role_name in ROLES:
                out += await self._pin(ScaledRole(role_name), count, now)
        views, failed = self._views(now)
        out += [await self._record_plan(p) for p in failed]
        for plan in decide(views, self.memory, self.limits, now, await self._outlook(now)):
            d = await self._apply(plan, views[plan.role], now)
            if d is not None:
                out.append(d)
        return out

    async def _outlook(self, now: float) -> Outlook | None:
        """This interval's traffic from the gateways, fed to the forecaster (None: no gateway to read)."""
        if self.scraper is None or self.members is None:
            return None
        gateways = {
            i.instance_id: i.metrics_address or i.http_address
            for i in self.members.instances("gateway")
            if (i.metrics_address or i.http_address) and i.state == InstanceState.READY
        }
        sample = await self.scraper.sample(gateways, time.monotonic())
        if sample is None:
            return None
        self.forecaster.update(sample)
        return Outlook(self.forecaster, self.start_s, self.pcfg.evaluation_interval_s, sample.itl_s, sample.ttft_s)

    def _views(self, now: float) -> tuple[dict[ScaledRole, RoleView], list[Plan]]:
        assert self.members is not None
        max_age = max(2.0, 5 * self.cfg.bus.load_report_interval_s)
        fresh = self.loads.fresh(max_age)
        # instances that left stop reporting: forget them, so a long run with many scale-ups stays bounded
        known = {i.instance_id for i in self.members.instances()}
        for iid in [k for k in self.loads.latest if k not in known and k not in fresh]:
            self.loads.latest.pop(iid, None)
            self.loads.received_at.pop(iid, None)
        views: dict[ScaledRole, RoleView] = {}
        failed: list[Plan] = []
        for role in ROLES:
            infos = [i for i in self.members.instances(role) if i.state != InstanceState.DRAINING]
            ready = [i for i in infos if i.state == InstanceState.READY]
            loads = tuple(
                _load(i, fresh[i.instance_id].load)
                for i in ready
                if i.instance_id in fresh and fresh[i.instance_id].epoch >= i.epoch
            )
            current = len(infos)
            expect = self._expect.get(role)
            if expect is not None:
                want, deadline, since = expect
                if len(ready) >= want:
                    del self._expect[role]
                    # how long instances take to serve: the forecast's horizon (smoothed, within reason)
                    self.start_s = min(
                        60.0, max(self.pcfg.evaluation_interval_s, 0.5 * self.start_s + 0.5 * (now - since))
                    )
                elif current >= want:
                    if now >= deadline:  # registered but never ready: the scale-up happened, stop timing it
                        del self._expect[role]
                elif now >= deadline:
                    del self._expect[role]
                    failed.append(
                        self._failed(
                            role,
                            want,
                            current,
                            now,
                            f"{want - current} new instances did not "
                            f"register within {self.pcfg.scale_up_timeout_s:.0f} s",
                        )
                    )
                else:
                    current = want
            views[role] = RoleView(role, current, loads, starting=len(infos) - len(ready), ready=len(ready))
        return views, failed

    def _failed(self, role: ScaledRole, want: int, have: int, now: float, why: str) -> Plan:
        mem = self.memory[role]
        mem.failures += 1
        wait = min(self.pcfg.scale_retry_max_s, 2.0**mem.failures)
        mem.retry_at = now + wait
        return Plan(
            role,
            Action.FAILED,
            have,
            want,
            f"scale-up to {want} failed: {why}; retry {mem.failures} in {wait:.0f} s",
            {"failures": float(mem.failures), "retry_in_s": wait},
        )

    async def _pin(self, role: ScaledRole, count: int, now: float) -> list[Decision]:
        mem = self.memory[role]
        mem.pin = count
        pin_s = self.pcfg.manual_pin_s
        mem.pin_until = now + pin_s if pin_s else float("inf")
        self._expect.pop(role, None)
        how_long = f"for {pin_s:.0f} s" if pin_s else f"until `pdrelay planner unpin {role}`"
        d = await self._record_plan(
            Plan(role, Action.PINNED, count, count, f"an operator scaled {role} to {count} by hand: pinned {how_long}")
        )
        return [d]

    async def _apply(self, plan: Plan, view: RoleView, now: float) -> Decision | None:
        role, mem = plan.role, self.memory[plan.role]
        self._m_target.labels(role.value).set(plan.target)
        est = plan.numbers.get("est_ttft_ms" if role == ScaledRole.PREFILL else "est_itl_ms")
        if est is not None:
            self._m_estimate.labels(role.value).set(est)
        if plan.action in (Action.HOLD, Action.PINNED):
            kind = f"{plan.action}:{plan.target}:" + re.sub(r"[\d.]+", "#", plan.reason)
            if self._last_kind.get(role) == kind:
                log.debug("%s %s: %s", role, plan.action, plan.reason)
                return None  # the same verdict for the same reason as last time: logged once
            self._last_kind[role] = kind
            return await self._record_plan(plan)
        assert self._actuator is not None and self.members is not None
        drain = tuple(DrainTarget(i, _host(self.members.get(i, role.value))) for i in plan.drain)
        try:
            done = await self._actuator.scale(role.value, plan.target, drain)
        except ScaleError as e:
            if plan.action == Action.SCALE_UP:
                return await self._record_plan(self._failed(role, plan.target, plan.current, now, str(e)))
            return await self._record_plan(
                Plan(role, Action.FAILED, plan.current, plan.target, f"scale-down failed: {e}", plan.numbers)
            )
        mem.last_change = now
        if plan.action == Action.SCALE_DOWN:
            self._expect.pop(role, None)  # a smaller size replaces a scale-up still under way
        if plan.action == Action.SCALE_UP:
            mem.last_up = now
            mem.failures = 0
            self._expect[role] = (plan.target, now + self.pcfg.scale_up_timeout_s, now)
        self._last_kind.pop(role, None)
        return await self._record_plan(
            Plan(role, plan.action, plan.current, plan.target, f"{plan.reason} [{done}]", plan.numbers, plan.drain)
        )

    async def _record_plan(self, plan: Plan) -> Decision:
        self._seq += 1
        d = Decision(
            seq=self._seq,
            ts=time.time(),
            planner=self.instance_id,
            role=plan.role.value,
            action=plan.action,
            current=plan.current,
            target=plan.target,
            reason=plan.reason,
            numbers={k: round(v, 3) for k, v in plan.numbers.items()},
            drain=plan.drain,
        )
        self.decisions.append(d)
        self._m_decisions.labels(d.role, d.action.value).inc()
        log.info("planner decision %d: %s %s %d -> %d: %s", d.seq, d.role, d.action, d.current, d.target, d.reason)
        if self.bus is not None:
            await publish_decision(self.bus, self.cluster, d)
        return d

    # ---- control (pdrelay planner log / unpin) -----------------------------------------------------------------
    async def _on_control(self, req: PlannerControl) -> PlannerReply | None:
        if self.election is None or not self.election.is_leader:
            return None  # the leader answers
        pins = {r.value: m.pin for r, m in self.memory.items() if m.pin is not None}
        if req.kind == ControlKind.LOG:
            last = tuple(self.decisions)[-req.last :] if req.last > 0 else ()
            return PlannerReply(ok=True, planner=self.instance_id, decisions=last, pins=pins)
        roles = [r for r in ROLES if req.role in ("", r.value)]
        if not roles:
            return PlannerReply(
                ok=False, planner=self.instance_id, message=f"unknown role {req.role!r}; choose from {', '.join(ROLES)}"
            )
        freed = [r.value for r in roles if self.memory[r].pin is not None]
        for r in roles:
            self.memory[r].pin = None
            self.memory[r].pin_until = float("inf")
            self._last_kind.pop(r, None)
        left = {k: v for k, v in pins.items() if k not in freed}
        return PlannerReply(
            ok=True,
            planner=self.instance_id,
            pins=left,
            message=f"unpinned {', '.join(freed)}" if freed else "nothing was pinned",
        )


def _load(info: InstanceInfo, s: Any) -> InstanceLoad:
    return InstanceLoad(
        instance_id=info.instance_id,
        running=s.running,
        queued=s.queued,
        pending_prefill_tokens=s.pending_prefill_tokens,
        free_pages=s.free_pages,
        total_pages=s.total_pages,
        step_ms=s.step_ms,
        busy=s.busy,
        compute_tokens_per_s=s.compute_tokens_per_s,
    )


def _host(info: InstanceInfo | None) -> str:
    return info.host if info is not None else ""
