"""Drain commands: tell one instance to stop taking work, finish what it has, deregister and exit.

With an AdminAuth (the cluster secret, shared.cluster.bus.admin_auth) commands are signed by the sender and
verified by the instance: an unsigned or wrongly signed command is logged and ignored.
"""

from __future__ import annotations

import logging

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.admin_auth import AdminAuth
from shared.cluster.bus.client import Bus, Handler, Meta

log = logging.getLogger(__name__)


class DrainCommand(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    reason: str = ""  # "scale_down" | "operator" | ...
    timeout_s: float = 0.0  # longest wait for in-flight work; 0: the instance's own drain timeout
    min_epoch: int = 0  # only an incarnation with epoch <= this drains (0: any); a restarted one is spared


async def send_drain(
    bus: Bus,
    cluster: str,
    instance_id: str,
    *,
    reason: str = "",
    timeout_s: float = 0.0,
    epoch: int = 0,
    auth: AdminAuth | None = None,
) -> bool:
    cmd = DrainCommand(instance_id=instance_id, reason=reason, timeout_s=timeout_s, min_epoch=epoch)
    subject = subjects.drain(cluster, instance_id)
    payload = bus.encode(cmd)
    return await bus.publish_raw(subject, payload, headers=auth.sign_headers(subject, payload) if auth else None)


async def subscribe_drain(
    bus: Bus, cluster: str, instance_id: str, handler: Handler[DrainCommand], *, auth: AdminAuth | None = None
) -> Subscription:
    """Deliver drain commands for `instance_id`; with `auth`, only those signed with the cluster secret."""
    if auth is None:
        return await bus.subscribe(subjects.drain(cluster, instance_id), DrainCommand, handler)

    async def verified(cmd: DrainCommand, meta: Meta) -> None:
        if auth.check(meta.subject, meta.data, meta.headers) is not None:
            return
        res = handler(cmd, meta)
        if res is not None:
            await res

    return await bus.subscribe(subjects.drain(cluster, instance_id), DrainCommand, verified)
