"""Drain commands: tell one instance to stop taking work, finish what it has, deregister and exit."""

from __future__ import annotations

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Handler


class DrainCommand(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    reason: str = ""  # "scale_down" | "operator" | ...
    timeout_s: float = 0.0  # longest wait for in-flight work; 0: the instance's own drain timeout
    min_epoch: int = 0  # only an incarnation with epoch <= this drains (0: any); a restarted one is spared


async def send_drain(bus: Bus, cluster: str, instance_id: str, *, reason: str = "", timeout_s: float = 0.0,
                     epoch: int = 0) -> bool:
    cmd = DrainCommand(instance_id=instance_id, reason=reason, timeout_s=timeout_s, min_epoch=epoch)
    return await bus.publish(subjects.drain(cluster, instance_id), cmd)


async def subscribe_drain(bus: Bus, cluster: str, instance_id: str, handler: Handler[DrainCommand]) -> Subscription:
    return await bus.subscribe(subjects.drain(cluster, instance_id), DrainCommand, handler)
