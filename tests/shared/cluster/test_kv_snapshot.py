"""KV snapshots over a real nats-server: a publisher's state fetched in parts, and a gateway's discovery that starts
after the instance did and rebuilds its KV index from the snapshot, then keeps it exact from the live events."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from services.gateway.routing.discovery import Discovery
from services.gateway.routing.kv_index import IndexState, KVIndex
from services.gateway.routing.kv_sync import index_status
from services.gateway.routing.policies import make_policy
from services.gateway.routing.router import Router
from shared.cluster.bus import kv_snapshot
from shared.cluster.bus.client import Bus
from shared.cluster.bus.kv_events import KVEventPublisher
from shared.cluster.bus.kv_index_status import KVIndexStatus, query_kv_index_status, serve_kv_index_status
from shared.cluster.bus.kv_snapshot import KVSnapshotServer, fetch_kv_snapshot
from shared.cluster.instance import InstanceInfo, InstanceState
from shared.cluster.localcluster.servers import NatsServer
from tests.services.gateway.test_grpc_backend import FakeMembership

pytestmark = pytest.mark.timeout(60)


async def _until(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


async def _query_until_answered(bus: Bus, gateway_id: str, within_s: float = 10.0) -> KVIndexStatus:
    """The status query, asked again while nobody answers yet: the gateway's subscription, made on its own
    connection, reaches the NATS server a moment later on a loaded box (NoResponders before that)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await query_kv_index_status(bus, "c1", gateway_id)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_snapshot_in_parts_and_a_late_gateway_rebuilds_exactly(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kv_snapshot, "PART_HASHES", 100)
    async with Bus(nats_server.url, name="instance") as ibus, Bus(nats_server.url, name="gateway") as gbus:
        pub = KVEventPublisher(ibus, "c1", "prefill-1", epoch=3, page_size=16, batch_window_s=0.001)
        server = KVSnapshotServer(ibus, "c1", "prefill-1", lambda: pub, lambda: 3)
        await server.start()
        pub.stored(range(1, 351))
        pub.evicted(range(1, 51))
        await pub.flush()
        snap = await fetch_kv_snapshot(gbus, "c1", "prefill-1")
        assert (snap.epoch, snap.seq, snap.page_size) == (3, 1, 16) and set(snap.hashes) == set(range(51, 351))

        # a gateway that starts now: discovery rebuilds the instance's entry from the snapshot
        membership = FakeMembership()
        info = InstanceInfo(cluster="c1", role="prefill", instance_id="prefill-1", grpc_address="x:1", epoch=3)
        membership.add(msgspec.structs.replace(info, state=InstanceState.READY))
        index = KVIndex()
        discovery = Discovery(membership, Router(make_policy("kv_aware"), kv_index=index), bus=gbus, cluster="c1")
        await discovery.start()
        try:
            assert await discovery.settle(5.0)
            assert index.state("prefill-1") == IndexState.EXACT and index.hashes("prefill-1") == set(range(51, 351))
            pub.stored(range(1000, 1010))  # live events after the snapshot keep it exact
            await pub.flush()
            await _until(lambda: 1005 in index.hashes("prefill-1"))
            assert index.state("prefill-1") == IndexState.EXACT and index.seq("prefill-1") == 2
            sub = await serve_kv_index_status(gbus, "c1", "gw-1", lambda: index_status(index, "gw-1"))
            got = await _query_until_answered(ibus, "gw-1")
            assert [(e.instance_id, e.state, e.pages) for e in got.entries] == [("prefill-1", "exact", 310)]
            await sub.unsubscribe()
        finally:
            await discovery.close()
            await server.close()
            await pub.close()
