"""Real pdrelay service processes for the disaggregation tests.

    procs = start_services(tmp, etcd, nats, model, [Spec("prefill", "p-1", "c", ("--transfer-backend", "nixl")), ...])
    ...
    stop_services(procs)            # SIGTERM (SIGKILL after a grace period), by PID; returns exit codes

Each is a ServiceProcess (shared.cluster.localcluster.service_process): stdout (the ready line, NIXL's INFO
logs) and stderr in files in tmp, started all at once and waited for together.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from proto.pdrelay.v1 import worker_pb2
from shared.cluster.localcluster.servers import EtcdServer, NatsServer
from shared.cluster.localcluster.service_process import ServiceProcess, stop_all, wait_all_ready

READY_TIMEOUT_S = 120.0  # several model processes starting together on a busy 2-core box
BACKENDS = ("nixl", "mooncake")
HANDOFF_TIMEOUT_S = 3.0  # the decode's --handoff-timeout-s in conftest.py: quarantine of a failed attempt's pages
NUM_PAGES = ("--num-pages", "256")  # 16 concurrent prompts of up to 12 pages each fit without queueing


@dataclass(frozen=True)
class Spec:
    role: str  # prefill | decode | worker
    instance_id: str
    cluster: str
    args: tuple[str, ...] = ()


@dataclass
class Servers:
    tmp: Path
    etcd: EtcdServer
    nats: NatsServer
    model_dir: Path


@dataclass
class BackendCluster:
    backend: str
    cluster: str
    procs: dict[str, ServiceProc]
    nats_url: str
    model_dir: Path

    def __getitem__(self, name: str) -> ServiceProc:
        """By name without the backend suffix: cl["d"], cl["pa-healthy"], ..."""
        return self.procs[f"{name}-{self.backend}"]


class ServiceProc(ServiceProcess):
    """One engine service of a test cluster; its name is the instance id."""

    def __init__(self, spec: Spec, tmp: Path, etcd: EtcdServer, nats: NatsServer, model: str | Path) -> None:
        self.spec = spec
        self.instance_id = spec.instance_id
        cmd = [
            sys.executable,
            "-m",
            f"services.{spec.role}",
            "--etcd-endpoints",
            etcd.url,
            "--nats-url",
            nats.url,
            "--cluster",
            spec.cluster,
            "--instance-id",
            spec.instance_id,
            "--model",
            str(model),
            "--threads",
            "1",
            "--lease-ttl-s",
            "5",
            "--load-report-interval-s",
            "0.1",
            *spec.args,
        ]
        super().__init__(spec.instance_id, cmd, tmp)

    def poll_ready(self) -> bool:
        ready = super().poll_ready()
        if ready:
            assert self.ready is not None
            assert self.ready.instance_id == self.instance_id and self.ready.role == self.spec.role, self.ready
        return ready

    @property
    def grpc(self) -> str:
        assert self.ready is not None, f"{self.instance_id} is not ready"
        return self.ready.grpc

    def target(self) -> worker_pb2.PrefillTarget:
        """How a client routes a request to this prefill instance (DecodeRequest.prefill)."""
        assert self.ready is not None and self.spec.role == "prefill"
        return worker_pb2.PrefillTarget(
            instance_id=self.instance_id, grpc_address=self.ready.grpc, epoch=self.ready.epoch
        )


def wait_ready(procs: Sequence[ServiceProcess], timeout: float = READY_TIMEOUT_S) -> None:
    wait_all_ready(procs, timeout)


def start_services(
    tmp: Path, etcd: EtcdServer, nats: NatsServer, model: str | Path, specs: Sequence[Spec]
) -> dict[str, ServiceProc]:
    """Start every spec at once, wait until all are ready; on failure stop what was started and re-raise."""
    procs = {s.instance_id: ServiceProc(s, tmp, etcd, nats, model) for s in specs}
    try:
        wait_ready(list(procs.values()))
    except BaseException:
        stop_services(procs.values())
        raise
    return procs


def stop_services(procs: Iterable[ServiceProcess], timeout: float = 20.0) -> dict[str, int | None]:
    """One SIGTERM each, then SIGKILL what has not exited after `timeout`; the exit codes by instance id."""
    return stop_all(procs, timeout)
