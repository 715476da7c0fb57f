"""The planner service's evaluation loop in process, with a fake actuator, membership and leadership: a refused
scale-up is retried with a doubling backoff and never turns into a scale-down (no flapping); an instance that
never registers counts as a failed scale-up; a size changed outside the planner is a pin; repeated holds are
published once."""

from __future__ import annotations

import asyncio
import time

from services.planner.actuators.base import ScaleError
from services.planner.service import PlannerService
from shared.cluster.bus.load import LoadReport, LoadSnapshot
from shared.cluster.bus.planner import Action
from shared.cluster.instance import InstanceInfo, InstanceState
from shared.config import resolve


class FakeActuator:
    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.refuse = False
        self.manual: dict[str, int] = {}

    async def start(self) -> None: ...

    async def scale(self, role, target, drain=()):  # type: ignore[no-untyped-def]
        self.calls.append((role, target))
        if self.refuse:
            raise ScaleError("HTTP 403 Forbidden")
        return f"{role} -> {target}"

    def desired(self, role):  # type: ignore[no-untyped-def]
        return None

    async def refresh(self) -> None: ...

    def take_manual(self):  # type: ignore[no-untyped-def]
        out, self.manual = self.manual, {}
        return out

    async def close(self) -> None: ...


class FakeMembers:
    def __init__(self, infos: list[InstanceInfo]) -> None:
        self.infos = infos

    def instances(self, role=None):  # type: ignore[no-untyped-def]
        return [i for i in self.infos if role is None or i.role == role]

    def get(self, iid, role=None):  # type: ignore[no-untyped-def]
        return next((i for i in self.infos if i.instance_id == iid), None)


class Leader:
    is_leader = True

    async def check(self) -> bool:
        return True


def info(role: str, n: int) -> InstanceInfo:
    return InstanceInfo(
        cluster="c", role=role, instance_id=f"{role}-{n}", grpc_address="x:1", epoch=n, state=InstanceState.READY
    )


def planner(actuator: FakeActuator, members: list[InstanceInfo]) -> PlannerService:
    cfg = resolve(
        "planner",
        [
            "--ttft-target-ms",
            "1000",
            "--scale-retry-max-s",
            "8",
            "--scale-up-cooldown-s",
            "0",
            "--scale-down-cooldown-s",
            "0",
            "--scale-up-timeout-s",
            "30",
            "--cluster",
            "c",
        ],
    )
    svc = PlannerService(cfg, actuator=actuator)
    svc.election = Leader()  # type: ignore[assignment]
    svc.members = FakeMembers(members)  # type: ignore[assignment]
    return svc


def report(svc: PlannerService, i: InstanceInfo, **load: float) -> None:
    svc.loads.latest[i.instance_id] = LoadReport(
        instance_id=i.instance_id, role=i.role, epoch=i.epoch, seq=1, ts=time.time(), load=LoadSnapshot(**load)
    )  # type: ignore[arg-type]
    svc.loads.received_at[i.instance_id] = time.monotonic()


def overloaded(svc: PlannerService, members: list[InstanceInfo]) -> None:
    for i in members:
        if i.role == "prefill":
            report(svc, i, pending_prefill_tokens=8000, compute_tokens_per_s=1000.0, busy=1.0, step_ms=500.0)
        else:
            report(svc, i, running=1, step_ms=20.0, busy=0.2, free_pages=900, total_pages=1000)


def test_refused_scale_up_backs_off_and_never_flaps() -> None:
    act = FakeActuator()
    act.refuse = True
    members = [info("prefill", 1), info("decode", 2)]
    svc = planner(act, members)

    async def go() -> list:  # type: ignore[type-arg]
        out = []
        for t in range(40):
            overloaded(svc, members)
            out += await svc.evaluate(now=1000.0 + t)
        return out

    got = asyncio.run(go())
    failed = [d for d in got if d.role == "prefill" and d.action == Action.FAILED]
    tries = [c for c in act.calls if c[0] == "prefill"]
    # tries at t = 0, 2, 6, 14, 22, 30, 38 (backoff 2, 4, 8, then capped at --scale-retry-max-s 8)
    assert len(tries) == 7 and len(failed) == 7, [(d.action, d.reason) for d in got]
    assert "HTTP 403" in failed[0].reason and "retry 1 in 2 s" in failed[0].reason
    assert "retry 4 in 8 s" in failed[3].reason
    assert not [d for d in got if d.action == Action.SCALE_DOWN]
    act.refuse = False

    async def recover() -> list:  # type: ignore[type-arg]
        overloaded(svc, members)
        return await svc.evaluate(now=1100.0)

    ups = [d for d in asyncio.run(recover()) if d.action == Action.SCALE_UP]
    assert ups and ups[0].target > 1 and svc.memory[ups[0].role].failures == 0


def test_instances_that_never_register_are_a_failed_scale_up() -> None:
    act = FakeActuator()
    members = [info("prefill", 1), info("decode", 2)]
    svc = planner(act, members)

    async def go() -> list:  # type: ignore[type-arg]
        overloaded(svc, members)
        first = await svc.evaluate(now=0.0)
        overloaded(svc, members)
        later = await svc.evaluate(now=31.0)  # past --scale-up-timeout-s: nobody new registered
        return first + later

    got = asyncio.run(go())
    assert [d.action for d in got if d.role == "prefill"][:2] == [Action.SCALE_UP, Action.FAILED]
    assert "did not register within 30 s" in next(d.reason for d in got if d.action == Action.FAILED)


def test_a_size_set_by_someone_else_pins_the_role_and_holds_are_published_once() -> None:
    act = FakeActuator()
    members = [info("prefill", 1), info("decode", 2)]
    svc = planner(act, members)
    act.manual = {"prefill": 1}

    async def go() -> list:  # type: ignore[type-arg]
        out = []
        for t in range(5):
            overloaded(svc, members)
            out += await svc.evaluate(now=float(t))
        return out

    got = asyncio.run(go())
    prefill = [d for d in got if d.role == "prefill"]
    assert prefill[0].action == Action.PINNED and "by hand" in prefill[0].reason
    assert all(d.action == Action.PINNED for d in prefill) and len(prefill) == 2  # the pin, then one "pinned" hold
    assert not [c for c in act.calls if c[0] == "prefill"]
    assert len([d for d in got if d.role == "decode"]) == 1  # the same hold five times: published once
