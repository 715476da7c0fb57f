"""Many hosts on one machine: a network namespace per host, joined by a bridge in a namespace of its own.

    <tag>-br        the bridge `br0`; one veth per host ends here (named v<k>)
    <tag>-<host>    a host: `lo` and `eth0` (the other end of its veth) with 198.18.0.<k+2>/24

Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range: never routed, never a real peer), and nothing is
created in the namespace the caller runs in: each veth pair is made inside the bridge namespace with its host end
sent straight into the host's namespace. `delete()` removes every namespace (their interfaces go with them).

Faults, per host (what `pdrelay chaos` rehearses):

    partition(h) / heal(h)     the host's veth is set down in the bridge namespace: nothing in or out
    loss(h, pct, egress=True)  an nftables rule in the host's namespace drops pct % of its outgoing (or incoming)
                               packets at random (TCP retransmits: slower, never wrong)
    latency(h, ms)             `tc netem` delay on the host's eth0; NetnsUnavailable where the kernel has no netem
    clear(h)                   back to normal

A process enters a host by `ip netns exec <ns> CMD` (exec_prefix) or, for the calling thread, `enter(ns)`; network
namespaces are per thread in Linux, so `in_netns(ns, fn)` runs fn on a thread of its own inside the namespace.
Needs root (CAP_NET_ADMIN) and iproute2; `unavailable()` says why not where it cannot work.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

SUBNET = ipaddress.ip_network("198.18.0.0/24")  # inside the benchmarking range 198.18.0.0/15
BRIDGE_ADDRESS = "198.18.0.1"
CLONE_NEWNET = 0x40000000
_NFT_TABLE = "pdrelay_chaos"


class NetnsUnavailable(Exception):
    """Network namespaces (or the asked-for kernel feature) cannot be used here; the message says why."""


def _run(*cmd: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    res = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and res.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(argv)}` failed: {(res.stderr or res.stdout).strip()}")
    return res


def unavailable() -> str | None:
    """None when namespaces, veths and a bridge can be made here; else the reason."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    probe = f"pdrelay-probe-{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        try:
            _run("ip", "link", "add", "br0", "type", "bridge", ns=probe)
        finally:
            _run("ip", "netns", "del", probe, check=False)
    except NetnsUnavailable as e:
        return str(e)
    return None


def netem_unavailable() -> str | None:
    """None when `tc qdisc ... netem` works in a namespace here; else the reason."""
    probe = f"pdrelay-netem-{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        try:
            _run("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", ns=probe)
        finally:
            _run("ip", "netns", "del", probe, check=False)
    except NetnsUnavailable as e:
        return f"tc netem is not available in this kernel ({e})"
    return None


@dataclass
class Host:
    name: str
    ns: str
    address: str
    veth: str  # its bridge-side interface, in the bridge namespace


@dataclass
class Topology:
    tag: str  # namespace name prefix, unique per topology on this machine
    hosts: dict[str, Host] = field(default_factory=dict)
    created: bool = False

    @property
    def bridge_ns(self) -> str:
        return f"{self.tag}-br"

    def create(self, names: Sequence[str] = ()) -> Topology:
        _run("ip", "netns", "add", self.bridge_ns)
        self.created = True
        br = self.bridge_ns
        _run("ip", "link", "set", "lo", "up", ns=br)
        _run("ip", "link", "add", "br0", "type", "bridge", ns=br)
        _run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", "br0", ns=br)
        _run("ip", "link", "set", "br0", "up", ns=br)
        for name in names:
            self.add(name)
        return self

    def add(self, name: str) -> Host:
        """One more host on the bridge (a new namespace with its address)."""
        if name in self.hosts:
            return self.hosts[name]
        k = len(self.hosts)
        address = str(SUBNET.network_address + 2 + k)
        if ipaddress.ip_address(address) not in SUBNET or address == str(SUBNET.broadcast_address):
            raise NetnsUnavailable(f"no address left in {SUBNET} for host {name!r}")
        host = Host(name, f"{self.tag}-{name}", address, f"v{k}")
        _run("ip", "netns", "add", host.ns)
        self.hosts[name] = host
        br = self.bridge_ns
        _run("ip", "link", "set", "lo", "up", ns=host.ns)
        _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns, ns=br)
        _run("ip", "link", "set", host.veth, "master", "br0", ns=br)
        _run("ip", "link", "set", host.veth, "up", ns=br)
        _run("ip", "addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0", ns=host.ns)
        _run("ip", "link", "set", "eth0", "up", ns=host.ns)
        return host

    def delete(self) -> None:
        """Remove every namespace of the topology (idempotent)."""
        for host in self.hosts.values():
            _run("ip", "netns", "del", host.ns, check=False)
        if self.created:
            _run("ip", "netns", "del", self.bridge_ns, check=False)
        self.created = False

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in topology {self.tag} (hosts: {', '.join(self.hosts)})") from None

    def exec_prefix(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.host(name).ns]

    # ------------------------------------------------------------------ faults

    def partition(self, name: str) -> None:
        _run("ip", "link", "set", self.host(name).veth, "down", ns=self.bridge_ns)

    def heal(self, name: str) -> None:
        _run("ip", "link", "set", self.host(name).veth, "up", ns=self.bridge_ns)

    def loss(self, name: str, percent: int, *, egress: bool = True) -> None:
        """Drop `percent` % of the host's outgoing (egress) or incoming packets, at random."""
        if not 0 < percent < 100:
            raise ValueError(f"loss percent {percent} must be between 1 and 99")
        ns = self.host(name).ns
        hook = "output" if egress else "input"
        _run("nft", "add", "table", "inet", _NFT_TABLE, ns=ns)
        _run("nft", "add", "chain", "inet", _NFT_TABLE, hook, f"{{ type filter hook {hook} priority 0; }}", ns=ns)
        _run(
            "nft",
            "add",
            "rule",
            "inet",
            _NFT_TABLE,
            hook,
            "numgen",
            "random",
            "mod",
            "100",
            "<",
            str(percent),
            "drop",
            ns=ns,
        )

    def latency(self, name: str, ms: float, jitter_ms: float = 0.0) -> None:
        ns = self.host(name).ns
        args = ["delay", f"{ms:g}ms", *((f"{jitter_ms:g}ms",) if jitter_ms else ())]
        res = _run("tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *args, ns=ns, check=False)
        if res.returncode != 0:
            raise NetnsUnavailable(f"tc netem is not available in this kernel: {(res.stderr or res.stdout).strip()}")

    def clear(self, name: str) -> None:
        """Undo loss and latency (a partition is undone by heal)."""
        ns = self.host(name).ns
        _run("nft", "delete", "table", "inet", _NFT_TABLE, ns=ns, check=False)
        _run("tc", "qdisc", "del", "dev", "eth0", "root", ns=ns, check=False)

    # ------------------------------------------------------------------ persistence

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"tag": self.tag, "hosts": [asdict(h) for h in self.hosts.values()]}, indent=1))

    @classmethod
    def load(cls, path: Path) -> Topology:
        data = json.loads(path.read_text())
        return cls(tag=data["tag"], hosts={h["name"]: Host(**h) for h in data["hosts"]}, created=True)


def enter(ns: str) -> None:
    """Move the calling thread into network namespace `ns` (threads it starts later are born there too)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsUnavailable(f"setns into {ns} failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """fn() run on a thread of its own inside namespace `ns`; its result, or its exception raised here."""
    out: list[T] = []
    err: list[BaseException] = []

    def body() -> None:
        try:
            enter(ns)
            out.append(fn())
        except BaseException as e:  # noqa: BLE001  handed to the caller
            err.append(e)

    t = threading.Thread(target=body, name=f"netns-{ns}", daemon=True)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]
