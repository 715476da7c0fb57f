"""A tensor-parallel rank that dies takes its instance down at once, loudly: the stream in flight ends with a
retryable error (the gateway replays it elsewhere), and the instance deregisters from etcd and exits 1 (so `pdrelay
up`'s supervisor starts it again), rather than stay listed as ready and fail every later request."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2
from services.chaos.scenarios import follower_pids
from shared.cluster.etcd import connect_etcd
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.membership import Membership
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import make_tiny_model
from tests.services.disagg.disagg_client import generate
from tests.services.disagg.disagg_procs import Spec, start_services, stop_services

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


async def _stream_kill_and_watch(grpc_address: str, rank_pid: int, etcd_url: str) -> tuple[common_pb2.Error, float]:
    """(the stream's error, seconds from the kill until the instance's key left etcd)."""
    client = await connect_etcd([etcd_url])
    members = Membership(client, "tp")
    await members.start()
    try:
        assert members.get("w-tp") is not None
        task = asyncio.ensure_future(generate(grpc_address, "long", list(range(5, 40)), max_tokens=400))
        await asyncio.sleep(1.0)  # mid-stream
        assert not task.done()
        os.kill(rank_pid, signal.SIGKILL)
        t_kill = time.monotonic()
        try:
            result = await task
            err = result.error
        except grpc.aio.AioRpcError as e:
            err = error_from_rpc(e)
        assert err is not None, "the stream ended normally although a rank died under it"
        await members.wait_for(lambda m: m.get("w-tp") is None, 30)
        return err, time.monotonic() - t_kill
    finally:
        await members.close()
        await client.close()


def test_a_lost_rank_ends_the_instance(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path, "qwen2")
    etcd = start_etcd(tmp_path)
    nats = start_nats(tmp_path)
    procs = {}
    try:
        # a lease far longer than the test: the key must go because the instance deregisters, not by expiry
        spec = Spec("worker", "w-tp", "tp", ("--tp-size", "2", "--lease-ttl-s", "60"))
        procs = start_services(tmp_path, etcd, nats, model, [spec])
        w = procs["w-tp"]
        ranks = follower_pids(w.proc.pid)
        assert len(ranks) == 1, f"one follower rank under the worker, found {ranks}"
        err, gone_after = asyncio.run(_stream_kill_and_watch(w.grpc, ranks[0], etcd.url))
        assert err.retryable, f"not a retryable error: {err}"
        assert gone_after < 20, f"the instance stayed registered {gone_after:.1f} s after losing its rank"
        deadline = time.monotonic() + 20
        while w.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not w.alive(), "the instance kept running without its rank"
        assert w.returncode == 1, w.log_tail()
        assert "engine lost" in w.log_tail()
    finally:
        stop_services(procs.values())
        nats.stop()
        etcd.stop()
