"""Real processes for the kvstore tests: a kvstore (no model) next to engine services started the way the
disaggregation tests start them (tests/services/disagg/disagg_procs.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc

from proto.pdrelay.v1 import worker_pb2, worker_pb2_grpc
from shared.cluster.localcluster.servers import EtcdServer, NatsServer
from shared.cluster.localcluster.service_process import ServiceProcess
from tests.services.disagg.disagg_procs import ServiceProc, Spec, stop_services, wait_ready

# Several engine processes start and stop together on a small shared box: generous bounds (they are not timings).
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


class KVStoreProc(ServiceProc):
    """A kvstore process: ServiceProc's readiness, logs and ending, without the engine flags."""

    def __init__(self, spec: Spec, tmp: Path, etcd: EtcdServer, nats: NatsServer) -> None:
        self.spec = spec
        self.instance_id = spec.instance_id
        cmd = [
            sys.executable,
            "-m",
            "services.kvstore",
            "--etcd-endpoints",
            etcd.url,
            "--nats-url",
            nats.url,
            "--cluster",
            spec.cluster,
            "--instance-id",
            spec.instance_id,
            "--lease-ttl-s",
            "5",
            "--load-report-interval-s",
            "0.1",
            *spec.args,
        ]
        ServiceProcess.__init__(self, spec.instance_id, cmd, tmp)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> KVStoreProc:
        super().wait_ready(timeout_s)
        return self


def start_engines(
    tmp: Path, etcd: EtcdServer, nats: NatsServer, model: str | Path, specs: list[Spec]
) -> dict[str, ServiceProc]:
    """start_services() with the bounds above; on failure what was started is stopped and the error re-raised."""
    procs = {s.instance_id: ServiceProc(s, tmp, etcd, nats, model) for s in specs}
    try:
        wait_ready(list(procs.values()), timeout=READY_TIMEOUT_S)
    except BaseException:
        stop_services(procs.values(), timeout=STOP_TIMEOUT_S)
        raise
    return procs


def store_stats(address: str) -> worker_pb2.KVStoreStatsResponse:
    async def call() -> worker_pb2.KVStoreStatsResponse:
        async with grpc.aio.insecure_channel(address) as ch:
            return await worker_pb2_grpc.KVStoreStub(ch).Stats(worker_pb2.KVStoreStatsRequest(), timeout=5)

    return asyncio.run(call())
