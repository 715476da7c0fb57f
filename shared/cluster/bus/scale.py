"""`pdrelay scale role=N ...`: a request to the local-cluster supervisor, answered with what it did."""

from __future__ import annotations

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Handler, Responder


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True):
    targets: dict[str, int]  # role -> wanted number of instances
    origin: str = "operator"  # "operator" (`pdrelay scale`) | "planner": the planner treats the others as pins
    drain: tuple[str, ...] = ()  # on scale-down, drain these instances first (e.g. the idlest one)


class ScaleReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str = ""
    started: tuple[str, ...] = ()  # instance ids launched
    draining: tuple[str, ...] = ()  # instance ids told to drain
    counts: dict[str, int] = msgspec.field(default_factory=dict)  # role -> instances after the change


async def request_scale(bus: Bus, cluster: str, targets: dict[str, int], *, timeout_s: float = 5.0,
                        origin: str = "operator", drain: tuple[str, ...] = ()) -> ScaleReply:
    return await bus.request(subjects.supervisor_scale(cluster),
                             ScaleRequest(targets=targets, origin=origin, drain=drain), ScaleReply, timeout_s=timeout_s)


async def observe_scale(bus: Bus, cluster: str, handler: Handler[ScaleRequest]) -> Subscription:
    """See every scale request (a plain subscriber next to the supervisor's responder; it does not answer)."""
    return await bus.subscribe(subjects.supervisor_scale(cluster), ScaleRequest, handler)


async def serve_scale(bus: Bus, cluster: str, responder: Responder[ScaleRequest, ScaleReply]) -> Subscription:
    return await bus.serve(subjects.supervisor_scale(cluster), ScaleRequest, responder)
