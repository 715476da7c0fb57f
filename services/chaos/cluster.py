"""The live cluster chaos works on: a `pdrelay up` run directory (who runs where, with which PIDs) plus its etcd
membership and NATS load reports. Faults are signals to those PIDs, so the cluster must run on this machine."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from shared.cluster.bus.client import Bus
from shared.cluster.bus.load import LoadTable
from shared.cluster.errors import ControlPlaneUnavailable
from shared.cluster.handshake import read_ready_file
from shared.cluster.localcluster.netns_hosts import TOPOLOGY_FILE
from shared.cluster.localcluster.rundir import ChildState, RunState, running_supervisor
from shared.cluster.netns import Topology
from shared.cluster.status import collect_status

ENGINE_ROLES = ("prefill", "decode", "worker")


def is_loopback(url: str) -> bool:
    host = urlsplit(url if "//" in url else f"//{url}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


class LiveCluster:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.bus: Bus | None = None
        self.loads = LoadTable()

    # ---- the run directory ---------------------------------------------------------------------------------
    def state(self) -> RunState:
        state = running_supervisor(self.run_dir)
        if state is None:
            raise ValueError(
                f"no cluster is running from {self.run_dir}; start one with `pdrelay up` "
                "(or pass --run-dir of a running one)"
            )
        return state

    def children(self, role: str | None = None) -> list[ChildState]:
        return [c for c in self.state().children if role is None or c.role == role]

    def gateway_url(self) -> str:
        gw = next((c for c in self.children("gateway") if c.http), None)
        if gw is None:
            raise ValueError(f"the cluster in {self.run_dir} has no gateway with an HTTP API; chaos needs one")
        return f"http://{gw.http}"

    def topology(self) -> Topology | None:
        """The hosts of a `pdrelay up --netns` cluster (None for one whose instances share a network)."""
        path = self.run_dir / TOPOLOGY_FILE
        return Topology.load(path) if self.state().netns and path.exists() else None

    def remote_endpoints(self) -> list[str]:
        """Endpoints of the cluster that are not on this machine's loopback (a `pdrelay up --netns` cluster's hosts
        are namespaces of this machine: none)."""
        s = self.state()
        if s.netns:
            return []
        urls = [
            s.etcd_url,
            s.nats_url,
            *(c.http for c in s.children if c.http),
            *(c.grpc for c in s.children if c.grpc),
        ]
        return [u for u in urls if u and not is_loopback(u)]

    # ---- the control plane -----------------------------------------------------------------------------------
    async def connect(self) -> None:
        self.bus = await Bus(self.state().nats_url, name="pdrelay-chaos").connect(timeout_s=5)
        await self.loads.subscribe(self.bus, self.state().cluster)

    async def close(self) -> None:
        await self.loads.close()
        if self.bus is not None:
            await self.bus.close()

    async def ready_epochs(self) -> dict[str, int] | None:
        """Epoch of every instance READY in etcd, by instance id (None while etcd does not answer)."""
        s = self.state()
        try:
            st = await collect_status(s.etcd_url, s.nats_url, s.cluster, load_window_s=0.0, timeout_s=2.0)
        except (ControlPlaneUnavailable, OSError):
            return None
        return {r.instance_id: r.epoch for r in st.rows if r.state == "ready"}

    def pages_in_use(self, max_age_s: float = 1.0) -> dict[str, int] | None:
        """Per engine instance, KV pages not free (running, arriving, held or quarantined), from fresh load
        reports; None until every engine instance of the run dir has reported."""
        ids = {c.instance_id for c in self.state().children if c.role in ENGINE_ROLES and c.state == "ready"}
        fresh = self.loads.fresh(max_age_s)
        if not ids <= set(fresh):
            return None
        return {i: fresh[i].load.total_pages - fresh[i].load.free_pages + fresh[i].load.running for i in ids}

    # ---- faults -----------------------------------------------------------------------------------------------
    @staticmethod
    def signal(pid: int, sig: signal.Signals) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def start_faulty_prefill(self, fault: str, instance_id: str) -> subprocess.Popen[bytes]:
        """One more prefill, configured as the cluster's first prefill but with `--fault-injection fault`."""
        from shared.config import ResolvedConfig
        from shared.config.resolved import Provenance

        base = next((c for c in self.children("prefill") if c.config), None)
        if base is None:
            raise ValueError("the cluster has no prefill instance to copy the configuration of")
        cfg = ResolvedConfig.from_json(Path(base.config).read_text())
        why = Provenance("cli", "pdrelay chaos")
        for key, value in (
            ("disagg.fault_injection", fault),
            ("discovery.instance_id", instance_id),
            ("grpc.grpc_port", 0),
            ("telemetry.metrics_port", 0),
        ):
            cfg = cfg.with_value(key, value, why)
        out = self.run_dir / "chaos"
        out.mkdir(parents=True, exist_ok=True)
        cfg_path, ready = out / f"{instance_id}.json", out / f"{instance_id}.ready"
        cfg_path.write_text(cfg.to_json())
        ready.unlink(missing_ok=True)
        with open(out / f"{instance_id}.log", "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.prefill",
                    "--resolved-config",
                    str(cfg_path),
                    "--ready-file",
                    str(ready),
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 300
        while read_ready_file(ready) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the {fault} prefill did not start; see {out / (instance_id + '.log')}")
            time.sleep(0.2)
        return proc
