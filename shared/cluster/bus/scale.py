"""`pdrelay scale role=N ...`: a request to the local-cluster supervisor, answered with what it did."""

from __future__ import annotations

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Responder


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True):
    targets: dict[str, int]  # role -> wanted number of instances


class ScaleReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str = ""
    started: tuple[str, ...] = ()  # instance ids launched
    draining: tuple[str, ...] = ()  # instance ids told to drain
    counts: dict[str, int] = msgspec.field(default_factory=dict)  # role -> instances after the change


async def request_scale(bus: Bus, cluster: str, targets: dict[str, int], *, timeout_s: float = 5.0) -> ScaleReply:
    return await bus.request(subjects.supervisor_scale(cluster), ScaleRequest(targets=targets), ScaleReply,
                             timeout_s=timeout_s)


async def serve_scale(bus: Bus, cluster: str, responder: Responder[ScaleRequest, ScaleReply]) -> Subscription:
    return await bus.serve(subjects.supervisor_scale(cluster), ScaleRequest, responder)
