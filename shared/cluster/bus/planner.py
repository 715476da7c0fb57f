"""The planner's channels: every decision it makes (published as it happens), and a control request for
`pdrelay planner log` (the leader's recent decisions) and `pdrelay planner unpin ROLE`."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Handler, Meta


class Action(enum.StrEnum):
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"  # nothing to change, or a change wanted but held back (cooldown, budget, bounds): see reason
    PINNED = "pinned"  # an operator scaled the role by hand: the planner leaves it alone
    FAILED = "failed"  # the actuator refused or failed; retried after a backoff


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """One evaluation's verdict for one role, with the numbers behind it."""

    seq: int
    ts: float  # unix seconds
    planner: str  # instance id of the leader that decided
    role: str
    action: Action
    current: int  # instances the role had (wanted) before
    target: int  # instances it should have after
    reason: str  # one sentence a human can check against `numbers`
    numbers: dict[str, float] = msgspec.field(default_factory=dict)
    drain: tuple[str, ...] = ()  # instances chosen to drain on a scale-down


class ControlKind(enum.StrEnum):
    LOG = "log"
    UNPIN = "unpin"


class PlannerControl(msgspec.Struct, frozen=True, kw_only=True):
    kind: ControlKind
    role: str = ""  # unpin: the role ("" = every role)
    last: int = 50  # log: how many recent decisions


class PlannerReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str = ""
    planner: str = ""
    decisions: tuple[Decision, ...] = ()
    pins: dict[str, int] = msgspec.field(default_factory=dict)


async def publish_decision(bus: Bus, cluster: str, decision: Decision) -> bool:
    return await bus.publish(subjects.planner_decisions(cluster), decision)


async def subscribe_decisions(bus: Bus, cluster: str, handler: Handler[Decision]) -> Subscription:
    return await bus.subscribe(subjects.planner_decisions(cluster), Decision, handler)


async def serve_control(
    bus: Bus, cluster: str, responder: Callable[[PlannerControl], Awaitable[PlannerReply | None]]
) -> Subscription:
    """Answer control requests with what `responder` returns; None (a standby planner) answers nothing, so the
    leader's reply is the one the caller gets."""

    async def handle(req: PlannerControl, meta: Meta) -> None:
        reply = await responder(req)
        if reply is not None and meta.reply:
            await bus.publish(meta.reply, reply)

    return await bus.subscribe(subjects.planner_control(cluster), PlannerControl, handle)


async def request_control(bus: Bus, cluster: str, control: PlannerControl, *, timeout_s: float = 3.0) -> PlannerReply:
    return await bus.request(subjects.planner_control(cluster), control, PlannerReply, timeout_s=timeout_s)
