"""etcd restarts leave no stray asyncio task behind: no "Task exception was never retrieved" (aclose() of a still
running request generator) and no "Task was destroyed but it is pending" once the dead watch streams are collected.

etcd3aio's own watch leaked one such task per reconnect; membership now watches through shared.cluster.etcd_watch.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from shared.cluster.etcd import connect_etcd
from shared.cluster.instance import InstanceInfo
from shared.cluster.localcluster.servers import EtcdServer
from shared.cluster.membership import Membership
from shared.cluster.registration import Registrar

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


async def _wait(cond: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def test_etcd_restarts_leak_no_task(etcd_server: EtcdServer) -> None:
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: reports.append(ctx))
    client = await connect_etcd([etcd_server.url])
    reg = Registrar(
        client, InstanceInfo(cluster="w", role="decode", instance_id="d1", grpc_address="127.0.0.1:1"), ttl_s=2
    )
    members = Membership(client, "w")
    try:
        await reg.register()
        await members.start()
        for _ in range(2):
            await asyncio.to_thread(etcd_server.kill)
            await _wait(lambda: members.stale)
            await asyncio.sleep(1.5)  # several failed reconnects of the watch
            await asyncio.to_thread(etcd_server.start)
            await _wait(lambda: not members.stale and len(members.instances()) == 1)
        gc.collect()  # dead streams and their tasks are collected here; a leaked task is reported now
        await asyncio.sleep(0.2)
    finally:
        await members.close()
        await reg.deregister()
        await client.close()
        gc.collect()
        await asyncio.sleep(0.1)
        loop.set_exception_handler(previous)
    assert not reports, [(r.get("message"), r.get("exception")) for r in reports]
