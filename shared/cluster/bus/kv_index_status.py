"""A gateway's KV index, per instance, over NATS request/reply on `pdrelay.<cluster>.kvindex.<gateway>`: what
`pdrelay status` shows next to the instances (exact / degraded / rebuilding, and why)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Meta


class KVIndexEntry(msgspec.Struct, frozen=True, array_like=True):
    instance_id: str
    state: str  # "exact" | "degraded" | "rebuilding"
    reason: str  # why not exact: "gap", "joined_late", "full", "over_limit", "no_snapshot", "snapshot"
    epoch: int
    seq: int  # last event applied
    pages: int


class KVIndexStatusRequest(msgspec.Struct, frozen=True):
    pass


class KVIndexStatus(msgspec.Struct, frozen=True, kw_only=True):
    gateway_id: str
    entries: tuple[KVIndexEntry, ...]
    total_entries: int  # (hash, instance) entries held
    max_entries: int  # the bound (past it new pages are dropped)
    approx_bytes: int
    snapshots: int  # snapshots applied since the gateway started
    gaps: int


async def serve_kv_index_status(
    bus: Bus, cluster: str, gateway_id: str, status: Callable[[], KVIndexStatus]
) -> Subscription:
    def answer(req: KVIndexStatusRequest, meta: Meta) -> KVIndexStatus:
        return status()

    sub = await bus.serve(subjects.kv_index_status(cluster, gateway_id), KVIndexStatusRequest, answer)
    with contextlib.suppress(Exception):  # NATS away: the subscription comes back with the connection
        await bus.flush()  # in place at the server before anyone is told about the gateway
    return sub


async def query_kv_index_status(bus: Bus, cluster: str, gateway_id: str, *, timeout_s: float = 1.0) -> KVIndexStatus:
    """Raises TimeoutError when the gateway does not answer."""
    return await bus.request(
        subjects.kv_index_status(cluster, gateway_id), KVIndexStatusRequest(), KVIndexStatus, timeout_s=timeout_s
    )
