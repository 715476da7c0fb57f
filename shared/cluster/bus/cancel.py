"""Cancellations: a request is over (client gone, deadline, operator); everyone holding work for it stops."""

from __future__ import annotations

import enum

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Handler


class CancelReason(enum.StrEnum):
    """Why a request was cancelled (on the wire as its value, "" when the sender gave none)."""

    UNSPECIFIED = ""
    CLIENT_DISCONNECTED = "client_disconnected"
    DEADLINE = "deadline"
    OPERATOR = "operator"


class Cancel(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    reason: CancelReason = CancelReason.UNSPECIFIED
    origin: str = ""  # instance id of the sender


async def publish_cancel(
    bus: Bus, cluster: str, request_id: str, *, reason: CancelReason = CancelReason.UNSPECIFIED, origin: str = ""
) -> bool:
    if not request_id:
        raise ValueError("cancel needs a request id (got an empty string)")
    return await bus.publish(subjects.cancel(cluster), Cancel(request_id=request_id, reason=reason, origin=origin))


async def subscribe_cancel(bus: Bus, cluster: str, handler: Handler[Cancel]) -> Subscription:
    return await bus.subscribe(subjects.cancel(cluster), Cancel, handler)
