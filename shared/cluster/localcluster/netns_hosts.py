"""`pdrelay up --netns`: a cluster of hosts on one machine, one network namespace per host (shared/cluster/netns.py).

    ctl        etcd and nats-server (their usual ports: each host has its own)
    client     the supervisor itself, and every `pdrelay` command that talks to the cluster (status, chaos, scale
               enter it on their own, see enter_cluster); a user runs `ip netns exec <client ns> curl ...`
    <id>       one host per instance (gateway-1, prefill-1, ...), which binds and advertises its own address
               (--host, --transfer-host); the kvstore's Mooncake master shares the first kvstore's host

Nothing is added to the namespace `pdrelay up` was started in; the namespaces go when the cluster stops (or with
`pdrelay down` if the supervisor died). KV moves over TCP between hosts: UCX is limited to its tcp transport
(UCX_TLS=tcp,self unless set), since UCX would otherwise see one machine and copy through shared memory.
"""

from __future__ import annotations

import os
from pathlib import Path

from shared.cluster.localcluster.servers import EtcdServer, MooncakeMaster, NatsServer
from shared.cluster.netns import NetnsUnavailable, Topology, enter, unavailable

CTL, CLIENT = "ctl", "client"
ETCD_PORTS = (2379, 2380)  # client, peer
NATS_PORT = 4222
MOONCAKE_PORTS = (50088, 50089, 50090)  # rpc, metadata, metrics
TOPOLOGY_FILE = "netns.json"


def instance_ids(counts: dict[str, int], order: tuple[str, ...]) -> list[str]:
    return [f"{role}-{i + 1}" for role in order for i in range(counts.get(role, 0))]


class NetnsHosts:
    def __init__(self, run_dir: Path) -> None:
        self.topology = Topology(tag=f"pdr{os.getpid()}")
        self.file = run_dir / TOPOLOGY_FILE

    def start(self, iids: list[str]) -> dict[str, str]:
        """Create the hosts and move the calling thread to the client host; returns instance id -> address."""
        reason = unavailable()
        if reason is not None:
            raise ValueError(f"--netns: {reason}; run `pdrelay up` without --netns")
        try:
            self.topology.create([CTL, CLIENT, *iids])
        except NetnsUnavailable as e:
            self.close()
            raise ValueError(f"--netns: {e}") from None
        self.topology.save(self.file)
        enter(self.client_ns)
        return {i: self.topology.host(i).address for i in iids}

    @property
    def client_ns(self) -> str:
        return self.topology.host(CLIENT).ns

    def address(self, name: str) -> str:
        return self.topology.host(name).address

    def add(self, iid: str) -> str:
        """A host for an instance `pdrelay scale` starts."""
        address = self.topology.add(iid).address
        self.topology.save(self.file)
        return address

    def prefix(self, name: str) -> tuple[str, ...]:
        return tuple(self.topology.exec_prefix(name))

    def control_plane(self, run_dir: Path, tls_dir: Path | None) -> tuple[EtcdServer, NatsServer]:
        """etcd and nats-server on the control host, on their usual ports."""
        ctl, prefix = self.address(CTL), self.prefix(CTL)
        etcd = EtcdServer(
            data_dir=run_dir / "etcd",
            host=ctl,
            port=ETCD_PORTS[0],
            peer_port=ETCD_PORTS[1],
            tie_to_parent=True,
            tls_dir=tls_dir,
            exec_prefix=prefix,
        )
        nats = NatsServer(
            data_dir=run_dir / "nats", host=ctl, port=NATS_PORT, tie_to_parent=True, tls_dir=tls_dir, exec_prefix=prefix
        )
        return etcd, nats

    def mooncake_master(self, run_dir: Path) -> MooncakeMaster:
        """The kvstore's Mooncake master on the first kvstore's host."""
        rpc, meta, metrics = MOONCAKE_PORTS
        return MooncakeMaster(
            data_dir=run_dir / "mooncake",
            host=self.address("kvstore-1"),
            port=rpc,
            metadata_port=meta,
            metrics_port=metrics,
            tie_to_parent=True,
            start_timeout_s=60.0,
            exec_prefix=self.prefix("kvstore-1"),
        )

    @staticmethod
    def env() -> dict[str, str]:
        return {"UCX_TLS": os.environ.get("UCX_TLS", "tcp,self")}

    def close(self) -> None:
        self.topology.delete()
        self.file.unlink(missing_ok=True)


def enter_cluster(run_dir: Path, netns: str) -> None:
    """For a command about to talk to a `pdrelay up --netns` cluster: move into its client host (before any thread
    or connection is made). `netns` is RunState.netns ("" for an ordinary cluster: nothing to do)."""
    if netns:
        if not Path(f"/run/netns/{netns}").exists():
            raise ValueError(f"the cluster's client namespace {netns} is gone ({run_dir} is stale)")
        enter(netns)


def delete_leftover(run_dir: Path) -> bool:
    """Remove the namespaces of a `--netns` cluster whose supervisor died (True when there were some)."""
    path = run_dir / TOPOLOGY_FILE
    if not path.exists():
        return False
    try:
        topo = Topology.load(path)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    topo.delete()
    path.unlink(missing_ok=True)
    return True
