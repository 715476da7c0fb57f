"""A small real cluster for API tests: etcd + NATS + gateway + model instances as child processes, one topology
at a time (colocated: one worker; disaggregated: one prefill + one decode over NIXL), stopped by PID."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shared.cluster.handshake import ReadyInfo, read_ready_file
from shared.cluster.localcluster.servers import stop_process
from tests.helpers.servers import start_etcd, start_nats

TOPOLOGIES = {"colocated": (("worker", 1),), "disaggregated": (("prefill", 1), ("decode", 1))}


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path
    ready: ReadyInfo | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class ApiCluster:
    topology: str
    model_dir: Path
    gateway: Proc
    procs: list[Proc] = field(default_factory=list)

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


def _spawn(name: str, module: str, args: list[str], tmp: Path) -> Proc:
    log_path, ready_file = tmp / f"{name}.log", tmp / f"{name}.ready"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, *args, "--ready-file", str(ready_file)], env=env,
                                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
    return Proc(name, proc, log_path, ready_file)


def _wait_ready(procs: list[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        while p.ready is None:
            if p.proc.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{p.name} not ready within {timeout:.0f} s:\n{p.log()[-4000:]}")
            p.ready = read_ready_file(p.ready_file)
            time.sleep(0.1)


@contextmanager
def api_cluster(topology: str, model_dir: Path, tmp: Path, cluster: str = "apitest",
                extra: tuple[str, ...] = ()) -> Iterator[ApiCluster]:
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    common = ["--etcd-endpoints", etcd.url, "--nats-url", nats.url, "--cluster", cluster, "--lease-ttl-s", "2",
              "--model", str(model_dir)]
    procs: list[Proc] = []
    try:
        for role, count in TOPOLOGIES[topology]:
            for i in range(1, count + 1):
                procs.append(_spawn(f"{role}-{i}", f"services.{role}", [
                    *common, "--instance-id", f"{role}-{i}", "--threads", "1", "--num-pages", "1024",
                    "--load-report-interval-s", "0.05", *extra], tmp))
        gateway = _spawn("gateway-1", "services.gateway", [*common, "--instance-id", "gateway-1", "--port", "0"], tmp)
        procs.append(gateway)
        _wait_ready(procs, 120.0)
        yield ApiCluster(topology, model_dir, gateway, procs)
    finally:
        for p in procs:
            stop_process(p.proc)
        etcd.stop()
        nats.stop()
