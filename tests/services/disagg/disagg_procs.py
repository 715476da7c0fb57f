"""Real pdrelay service processes for the disaggregation tests.

    procs = start_services(tmp, etcd, nats, model, [Spec("prefill", "p-1", "c", ("--transfer-backend", "nixl")), ...])
    ...
    stop_services(procs)            # SIGTERM (SIGKILL after a grace period), by PID; returns exit codes

Each service's stdout (where the one JSON ready line goes, and NIXL's INFO logs) and stderr go to files in tmp,
so a chatty service never blocks on a full pipe. Services are started all at once and waited for together:
start-up is mostly imports and model loading, so they overlap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from proto.pdrelay.v1 import worker_pb2
from shared.cluster.handshake import ReadyInfo, parse_ready_line
from shared.cluster.localcluster.servers import EtcdServer, NatsServer

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


class ServiceProc:
    def __init__(self, spec: Spec, tmp: Path, etcd: EtcdServer, nats: NatsServer, model: str | Path) -> None:
        self.spec = spec
        self.instance_id = spec.instance_id
        self.out_path = tmp / f"{spec.instance_id}.out"
        self.err_path = tmp / f"{spec.instance_id}.err"
        cmd = [sys.executable, "-m", f"services.{spec.role}", "--etcd-endpoints", etcd.url, "--nats-url", nats.url,
               "--cluster", spec.cluster, "--instance-id", spec.instance_id, "--model", str(model), "--threads", "1",
               "--lease-ttl-s", "5", "--load-report-interval-s", "0.1", *spec.args]
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        self.info: ReadyInfo | None = None

    # ---- readiness -------------------------------------------------------------------------------------------------
    def poll_ready(self) -> ReadyInfo | None:
        if self.info is None:
            for line in self.out_path.read_bytes().splitlines():
                info = parse_ready_line(line)
                if info is not None:
                    assert info.instance_id == self.instance_id and info.role == self.spec.role, info
                    self.info = info
                    break
        return self.info

    @property
    def grpc(self) -> str:
        assert self.info is not None, f"{self.instance_id} is not ready"
        return self.info.grpc

    def target(self) -> worker_pb2.PrefillTarget:
        """How a client routes a request to this prefill instance (DecodeRequest.prefill)."""
        assert self.info is not None and self.spec.role == "prefill"
        return worker_pb2.PrefillTarget(instance_id=self.instance_id, grpc_address=self.info.grpc,
                                        epoch=self.info.epoch)

    # ---- logs and ending -------------------------------------------------------------------------------------------
    def log(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int:
        """SIGKILL, like a crash or an OOM kill."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(10)


def wait_ready(procs: Sequence[ServiceProc], timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending:
        for p in list(pending):
            if p.poll_ready() is not None:
                pending.remove(p)
            elif not p.alive():
                raise RuntimeError(f"{p.instance_id} exited with {p.proc.returncode} before ready:\n{p.log_tail()}")
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"not ready within {timeout:.0f} s: {[p.instance_id for p in pending]}\n"
                               + "\n".join(p.log_tail(10) for p in pending))
        time.sleep(0.1)


def start_services(tmp: Path, etcd: EtcdServer, nats: NatsServer, model: str | Path,
                   specs: Sequence[Spec]) -> dict[str, ServiceProc]:
    """Start every spec at once, wait until all are ready; on failure stop what was started and re-raise."""
    procs = {s.instance_id: ServiceProc(s, tmp, etcd, nats, model) for s in specs}
    try:
        wait_ready(list(procs.values()))
    except BaseException:
        stop_services(procs.values())
        raise
    return procs


def stop_services(procs: Iterable[ServiceProc], timeout: float = 20.0) -> dict[str, int | None]:
    """One SIGTERM each (so they drain in parallel; a second one means "stop now"), then wait; SIGKILL what has
    not exited after `timeout`. Returns the exit codes (negative: killed by that signal)."""
    plist = list(procs)
    for p in plist:
        if p.alive():
            p.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    codes: dict[str, int | None] = {}
    for p in plist:
        try:
            codes[p.instance_id] = p.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[p.instance_id] = p.kill()
    return codes
