"""Hosts on one machine (shared/cluster/netns.py): two namespaces on a bridge reach each other by address; a partition
cuts them apart and heal joins them again; loss rules come and go; the topology survives a save / load and every
namespace goes with delete(). Skipped, with the reason, where namespaces cannot be made."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from shared.cluster import netns

pytestmark = pytest.mark.timeout(60)


def _connect(address: str, port: int, tries: int = 1) -> bool:
    for i in range(tries):
        try:
            socket.create_connection((address, port), timeout=0.5).close()
            return True
        except OSError:
            if i + 1 < tries:
                time.sleep(0.2)  # a port just set up on the bridge takes a moment to forward
    return False


def test_two_hosts_partition_heal_loss_and_cleanup(tmp_path: Path) -> None:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be made here: {reason}")
    topo = netns.Topology(f"pdrt{os.getpid()}").create(["a", "b"])
    try:
        a, b = topo.host("a"), topo.host("b")
        assert a.address != b.address and a.address.startswith("198.18.")
        server = netns.in_netns(b.ns, lambda: socket.create_server((b.address, 7000)))
        try:
            assert netns.in_netns(a.ns, lambda: _connect(b.address, 7000, tries=15))
            own = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
            assert "198.18." not in own, "an address of the topology landed in the test's own namespace"
            topo.partition("b")
            assert not netns.in_netns(a.ns, lambda: _connect(b.address, 7000))
            topo.heal("b")
            assert netns.in_netns(a.ns, lambda: _connect(b.address, 7000, tries=15))
            topo.loss("a", 50)
            rules = subprocess.run(
                ["ip", "netns", "exec", a.ns, "nft", "list", "ruleset"], capture_output=True, text=True
            )
            assert "numgen random mod 100 < 50" in rules.stdout
            topo.clear("a")
            assert netns.in_netns(a.ns, lambda: _connect(b.address, 7000))
        finally:
            server.close()
        topo.save(tmp_path / "netns.json")
        again = netns.Topology.load(tmp_path / "netns.json")
        assert again.hosts == topo.hosts
    finally:
        topo.delete()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"pdrt{os.getpid()}-" not in left
