"""Registration + membership against a real etcd: joins/leaves, epochs, partitions, etcd restarts and replacement."""

from __future__ import annotations

import asyncio
import logging

import pytest
from etcd3aio import Etcd3Client

from shared.cluster.etcd import connect_etcd, etcd_target
from shared.cluster.instance import InstanceInfo, InstanceState, instance_key
from shared.cluster.membership import EventKind, Membership, MembershipEvent
from shared.cluster.registration import Registrar
from tests.helpers.servers import TcpProxy

pytestmark = pytest.mark.timeout(60)

TTL = 2  # etcd's smallest effective lease TTL


def _info(iid: str, role: str = "decode", cluster: str = "t") -> InstanceInfo:
    return InstanceInfo(cluster=cluster, role=role, instance_id=iid, grpc_address="127.0.0.1:1")


async def _client(endpoint: str) -> Etcd3Client:
    return await connect_etcd([f"http://{endpoint}"], timeout_s=5)


def _ids(m: Membership, role: str | None = None) -> list[str]:
    return [i.instance_id for i in m.instances(role)]


def test_etcd_target_parsing() -> None:
    assert etcd_target("http://127.0.0.1:2379") == "127.0.0.1:2379"
    assert etcd_target("localhost:1234") == "localhost:1234"
    assert etcd_target("https://127.0.0.1:2379") == "127.0.0.1:2379"  # TLS: shared.cluster.tls
    for bad in ("ftp://h:1", "http://h", "http://h:1/x", "h:notaport"):
        with pytest.raises(ValueError, match="etcd endpoint"):
            etcd_target(bad)


async def test_join_update_leave_and_epochs(etcd_server) -> None:
    c1, c2 = await _client(etcd_server.endpoint), await _client(etcd_server.endpoint)
    events: list[MembershipEvent] = []
    async with Membership(c2, "t") as m:
        m.on_event(events.append)
        a, b = Registrar(c1, _info("a"), ttl_s=TTL), Registrar(c1, _info("b", role="prefill"), ttl_s=TTL)
        ea = await a.register()
        eb = await b.register()
        assert ea >= 1 and eb == ea + 1, "every registration in a cluster takes the next epoch"
        await m.wait_for(lambda m: _ids(m) == ["b", "a"] or _ids(m) == ["a", "b"], 5)
        assert _ids(m, "decode") == ["a"] and _ids(m, "prefill") == ["b"]
        assert m.get("a").state == InstanceState.STARTING and m.get("a").epoch == ea

        await a.set_state(InstanceState.READY)
        await m.wait_for(lambda m: [i.instance_id for i in m.ready()] == ["a"], 5)

        await a.deregister()  # revoke: gone at once, not after the TTL
        await m.wait_for(lambda m: _ids(m) == ["b"], 1.5)
        kinds = [(e.kind, e.instance.instance_id) for e in events]
        assert kinds == [(EventKind.JOIN, "a"), (EventKind.JOIN, "b"), (EventKind.UPDATE, "a"), (EventKind.LEAVE, "a")]
        assert events[2].previous is not None and events[2].previous.state == InstanceState.STARTING
        await b.deregister()
    await c1.close()
    await c2.close()


async def test_async_iteration_of_events(etcd_server) -> None:
    c = await _client(etcd_server.endpoint)
    async with Membership(c, "t", role="decode") as m:
        seen: list[tuple[str, str]] = []

        async def consume() -> None:
            async for ev in m.events():
                seen.append((ev.kind, ev.instance.instance_id))
                if ev.kind == "leave":
                    return

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)
        r = Registrar(c, _info("x"), ttl_s=TTL)
        other_role = Registrar(c, _info("y", role="prefill"), ttl_s=TTL)  # filtered out by role
        await other_role.register()
        await r.register()
        await r.set_state(InstanceState.DRAINING)
        await r.deregister()
        await asyncio.wait_for(task, 15)
        # A watch restarted by a slow probe on a loaded box resyncs from a snapshot, which may fold the update
        # into the join; the order and the role filter must hold either way.
        assert seen[0] == ("join", "x") and seen[-1] == ("leave", "x"), seen
        assert set(seen[1:-1]) <= {("update", "x")}, seen
        await other_role.deregister()
    await c.close()


async def test_the_first_instance_registering_after_start_is_not_a_new_store(etcd_server) -> None:
    # A fresh cluster has no epoch counter until its first instance registers. A watch created after that (the
    # first one, or one the client re-created) must not take the new counter for a replaced etcd: that resync came
    # from a full read, so an instance that joined and left in between was never seen at all.
    c = await _client(etcd_server.endpoint)
    async with Membership(c, "t", role="decode") as m:
        r = Registrar(c, _info("x"), ttl_s=TTL)
        await r.register()
        await r.deregister()
        assert not await m._store_replaced(m._revision)
        assert not await m._store_replaced(m._revision)  # the counter it now knows
    await c.close()


async def test_key_expires_with_the_lease_when_keepalive_stops(etcd_server) -> None:
    c1, c2 = await _client(etcd_server.endpoint), await _client(etcd_server.endpoint)
    async with Membership(c2, "t") as m:
        r = Registrar(c1, _info("crash"), ttl_s=TTL)
        await r.register()
        await m.wait_for(lambda m: _ids(m) == ["crash"], 5)
        await c1.close()  # the process "dies": no keep-alive, no revoke
        t0 = asyncio.get_running_loop().time()
        await m.wait_for(lambda m: _ids(m) == [], TTL + 3)
        assert asyncio.get_running_loop().time() - t0 <= TTL + 3
    await c2.close()


async def test_malformed_value_is_skipped(etcd_server, caplog: pytest.LogCaptureFixture) -> None:
    c = await _client(etcd_server.endpoint)
    await c.kv.put(instance_key("t", "decode", "junk"), b"{not json")
    await c.kv.put(
        instance_key("t", "decode", "liar"),
        b'{"cluster":"t","role":"decode","instance_id":"other","grpc_address":"x:1"}',
    )
    with caplog.at_level(logging.WARNING, logger="shared.cluster.membership"):
        async with Membership(c, "t") as m:
            assert _ids(m) == []
            r = Registrar(c, _info("good"), ttl_s=TTL)
            await r.register()
            await c.kv.put(instance_key("t", "decode", "junk2"), b"\xff\xfe")
            await m.wait_for(lambda m: _ids(m) == ["good"], 5)
            await asyncio.sleep(0.2)
            assert _ids(m) == ["good"]
            await r.deregister()
    assert sum("skipping" in rec.getMessage() for rec in caplog.records) >= 3
    await c.close()


async def test_partitioned_consumer_keeps_membership_then_resumes_from_last_revision(etcd_server) -> None:
    proxy = await TcpProxy("127.0.0.1", etcd_server.port).start()
    direct = await _client(etcd_server.endpoint)
    via_proxy = await connect_etcd([f"http://{proxy.address}"])
    a, b = Registrar(direct, _info("a"), ttl_s=TTL), Registrar(direct, _info("b"), ttl_s=TTL)
    await a.register()
    await b.register()
    async with Membership(via_proxy, "t", probe_interval_s=0.2) as m:
        events: list[MembershipEvent] = []
        m.on_event(events.append)
        assert _ids(m) == ["a", "b"] and not m.stale
        await proxy.cut()
        await m.wait_for(lambda m: m.stale, 5)
        # changes the consumer cannot see yet
        await b.deregister()
        c = Registrar(direct, _info("c"), ttl_s=TTL)
        await c.register()
        await asyncio.sleep(0.3)
        assert m.stale and _ids(m) == ["a", "b"], "a stale view keeps serving the last known membership"
        await proxy.heal()
        await m.wait_for(lambda m: not m.stale and _ids(m) == ["a", "c"], 10)
        assert m.resyncs == 0, "a short partition resumes the watch instead of re-reading everything"
        assert [(e.kind, e.instance.instance_id) for e in events] == [("leave", "b"), ("join", "c")]
        await a.deregister()
        await c.deregister()
    await proxy.close()
    await via_proxy.close()
    await direct.close()


async def test_compacted_history_forces_a_full_resync(etcd_server) -> None:
    proxy = await TcpProxy("127.0.0.1", etcd_server.port).start()
    direct = await _client(etcd_server.endpoint)
    via_proxy = await connect_etcd([f"http://{proxy.address}"])
    a = Registrar(direct, _info("a"), ttl_s=TTL)
    await a.register()
    async with Membership(via_proxy, "t", probe_interval_s=0.2) as m:
        await proxy.cut()
        await m.wait_for(lambda m: m.stale, 5)
        await a.deregister()
        b = Registrar(direct, _info("b"), ttl_s=TTL)
        await b.register()
        await b.set_state(InstanceState.READY)
        head = (await direct.kv.get("x")).header.revision
        await direct.kv.compact(head, physical=True)
        await proxy.heal()
        await m.wait_for(lambda m: not m.stale and _ids(m) == ["b"], 10)
        assert m.get("b").state == InstanceState.READY
        assert m.resyncs == 1
        await b.deregister()
    await proxy.close()
    await via_proxy.close()
    await direct.close()


async def test_lost_lease_reregisters_with_a_higher_epoch(etcd_server) -> None:
    """A registrar partitioned from etcd longer than its TTL loses its key; on healing it comes back, newer."""
    proxy = await TcpProxy("127.0.0.1", etcd_server.port).start()
    direct = await _client(etcd_server.endpoint)
    via_proxy = await connect_etcd([f"http://{proxy.address}"])
    epochs: list[int] = []
    r = Registrar(via_proxy, _info("p"), ttl_s=TTL, on_epoch=epochs.append)
    first = await r.register()
    await r.set_state(InstanceState.READY)
    async with Membership(direct, "t") as m:
        await m.wait_for(lambda m: _ids(m) == ["p"], 5)
        await proxy.cut()
        await m.wait_for(lambda m: _ids(m) == [], TTL + 4)  # etcd expired the lease
        await proxy.heal()
        await m.wait_for(lambda m: _ids(m) == ["p"], 10)
        back = m.get("p")
        for _ in range(50):  # the watcher may see the new key before the registrar's txn call returns
            if r.epoch == back.epoch:
                break
            await asyncio.sleep(0.02)
        assert back.epoch > first and r.epoch == back.epoch and r.lease_losses == 1
        assert back.state == InstanceState.READY, "re-registration keeps the latest state"
        assert epochs == [first, back.epoch]
    await r.deregister()
    await proxy.close()
    await via_proxy.close()
    await direct.close()


@pytest.mark.slow
async def test_etcd_restart_keeps_membership_stale_then_resyncs(etcd_server) -> None:
    c_reg, c_watch = await _client(etcd_server.endpoint), await _client(etcd_server.endpoint)
    r = Registrar(c_reg, _info("s"), ttl_s=TTL)
    await r.register()
    async with Membership(c_watch, "t", probe_interval_s=0.2) as m:
        await m.wait_for(lambda m: _ids(m) == ["s"], 5)
        etcd_server.kill()
        await m.wait_for(lambda m: m.stale, 5)
        await asyncio.sleep(TTL + 0.5)  # longer than the TTL: etcd is down, so nothing can expire
        assert _ids(m) == ["s"], "the last known membership is served while etcd is down"
        await asyncio.to_thread(etcd_server.start)  # same port, same data: leases survive the restart
        await m.wait_for(lambda m: not m.stale, 15)
        late = Registrar(c_reg, _info("late"), ttl_s=TTL)
        await late.register()
        await m.wait_for(lambda m: _ids(m) == ["late", "s"], 10)
        await late.deregister()
    await r.deregister()
    await c_reg.close()
    await c_watch.close()


@pytest.mark.slow
async def test_replaced_etcd_gets_reregistration_with_higher_epoch(etcd_server) -> None:
    """etcd comes back empty (data lost): the registrar re-registers above its old epoch; watchers resync."""
    c_reg, c_watch = await _client(etcd_server.endpoint), await _client(etcd_server.endpoint)
    r = Registrar(c_reg, _info("s"), ttl_s=TTL)
    for _ in range(3):  # push the epoch counter up so a fresh counter would restart below it
        other = Registrar(c_reg, _info("o"), ttl_s=TTL)
        await other.register()
        await other.deregister()
    old_epoch = await r.register()
    async with Membership(c_watch, "t", probe_interval_s=0.2) as m:
        await m.wait_for(lambda m: _ids(m) == ["s"], 5)
        etcd_server.kill()
        etcd_server.wipe()
        await asyncio.to_thread(etcd_server.start)
        await m.wait_for(lambda m: not m.stale and _ids(m) == ["s"] and m.get("s").epoch > old_epoch, 20)
        for _ in range(50):  # the watcher may see the new key before the registrar's txn call returns
            if r.epoch == m.get("s").epoch:
                break
            await asyncio.sleep(0.02)
        assert r.lease_losses == 1 and r.epoch == m.get("s").epoch
    await r.deregister()
    await c_reg.close()
    await c_watch.close()


@pytest.mark.slow
async def test_replaced_etcd_with_more_writes_than_before_is_still_detected(etcd_server) -> None:
    """A new etcd whose revision already passed ours would let a resumed watch skip everything: detect it."""
    proxy = await TcpProxy("127.0.0.1", etcd_server.port).start()
    direct = await _client(etcd_server.endpoint)
    via_proxy = await connect_etcd([f"http://{proxy.address}"])
    ghost = Registrar(direct, _info("ghost"), ttl_s=TTL)
    await ghost.register()
    async with Membership(via_proxy, "t", probe_interval_s=0.2) as m:
        await m.wait_for(lambda m: _ids(m) == ["ghost"], 5)
        old_revision = m.revision
        await proxy.cut()
        await m.wait_for(lambda m: m.stale, 5)
        etcd_server.kill()
        etcd_server.wipe()
        await asyncio.to_thread(etcd_server.start)
        await direct.close()  # the ghost's process is gone too: it never re-registers
        fresh = await _client(etcd_server.endpoint)
        for i in range(old_revision + 5):  # push the new store's revision past the one the watcher knows
            await fresh.kv.put("/unrelated/k", str(i))
        newcomer = Registrar(fresh, _info("new"), ttl_s=TTL)
        await newcomer.register()
        assert (await fresh.kv.get("x")).header.revision > old_revision
        await proxy.heal()
        await m.wait_for(lambda m: not m.stale and _ids(m) == ["new"], 10)
        assert m.resyncs == 1
        await newcomer.deregister()
        await fresh.close()
    await proxy.close()
    await via_proxy.close()
