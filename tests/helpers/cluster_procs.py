"""A small real cluster for API tests: etcd + NATS + gateway + model instances as child processes, one topology
at a time (colocated: one worker; disaggregated: one prefill + one decode over NIXL), stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shared.cluster.localcluster.service_process import ServiceProcess, python_cmd, stop_all, wait_all_ready
from tests.helpers.servers import start_etcd, start_nats

TOPOLOGIES = {"colocated": (("worker", 1),), "disaggregated": (("prefill", 1), ("decode", 1))}


@dataclass
class ApiCluster:
    topology: str
    model_dir: Path
    gateway: ServiceProcess
    procs: list[ServiceProcess] = field(default_factory=list)

    @property
    def http(self) -> str:
        assert self.gateway.ready is not None
        return f"http://{self.gateway.ready.http}"

    @property
    def grpc(self) -> str:
        assert self.gateway.ready is not None and self.gateway.ready.grpc
        return self.gateway.ready.grpc

    def logs(self) -> str:
        return "\n".join(f"----- {p.name}\n{p.log()[-3000:]}" for p in self.procs)


@contextmanager
def api_cluster(
    topology: str, model_dir: Path, tmp: Path, cluster: str = "apitest", extra: tuple[str, ...] = ()
) -> Iterator[ApiCluster]:
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    common = [
        "--etcd-endpoints",
        etcd.url,
        "--nats-url",
        nats.url,
        "--cluster",
        cluster,
        "--lease-ttl-s",
        "2",
        "--model",
        str(model_dir),
    ]
    procs: list[ServiceProcess] = []
    try:
        for role, count in TOPOLOGIES[topology]:
            for i in range(1, count + 1):
                name = f"{role}-{i}"
                procs.append(
                    ServiceProcess(
                        name,
                        python_cmd(
                            f"services.{role}",
                            *common,
                            "--instance-id",
                            name,
                            "--threads",
                            "1",
                            "--num-pages",
                            "1024",
                            "--load-report-interval-s",
                            "0.05",
                            *extra,
                        ),
                        tmp,
                    )
                )
        gateway = ServiceProcess(
            "gateway-1", python_cmd("services.gateway", *common, "--instance-id", "gateway-1", "--port", "0"), tmp
        )
        procs.append(gateway)
        wait_all_ready(procs, 120.0)
        yield ApiCluster(topology, model_dir, gateway, procs)
    finally:
        stop_all(procs, 5.0)
        etcd.stop()
        nats.stop()
