"""The network as a fault, on a cluster of hosts (`pdrelay up --netns`: a network namespace per instance).

    partition-<role>      the host of one prefill / decode / kvstore is cut off the bridge (nothing in or out)
                          for --hang-s, then reconnected
    loss-oneway-prefill   30% of the packets one prefill host sends are dropped (what it receives arrives): its
                          answers, KV writes and heartbeats crawl through TCP retransmits, its requests do not
    kv-loss               10% of the packets a prefill host and a decode host send are dropped: both directions of
                          the KV path between them
    kv-latency            40 ms (+-10 ms) added to everything a prefill host and a decode host send (tc netem;
                          skipped where the kernel has no netem)

Each lasts --hang-s, then the hosts are put right. On a cluster without namespaces these scenarios do not apply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from shared.cluster.netns import NetnsUnavailable, Topology

if TYPE_CHECKING:
    from services.chaos.cluster import LiveCluster

ONE_WAY_LOSS_PCT = 30
KV_LOSS_PCT = 10
KV_LATENCY_MS, KV_JITTER_MS = 40.0, 10.0


class NetworkFault:
    """What was done to which hosts, and how to undo it."""

    def __init__(self, target: str, undo: Callable[[], Awaitable[None]]) -> None:
        self.target = target
        self.undo = undo


def hosts_of(cluster: LiveCluster) -> Topology:
    topo = cluster.topology()
    if topo is None:
        raise NetnsUnavailable(
            "the cluster's instances share one network; start it with `pdrelay up --netns` for network faults"
        )
    return topo


async def _do(fn: Callable[[], None]) -> None:
    await asyncio.to_thread(fn)


async def partition(cluster: LiveCluster, host: str) -> NetworkFault:
    topo = hosts_of(cluster)
    await _do(lambda: topo.partition(host))
    return NetworkFault(host, lambda: _do(lambda: topo.heal(host)))


async def one_way_loss(cluster: LiveCluster, host: str) -> NetworkFault:
    topo = hosts_of(cluster)
    await _do(lambda: topo.loss(host, ONE_WAY_LOSS_PCT, egress=True))
    return NetworkFault(f"{host} (sends, {ONE_WAY_LOSS_PCT}%)", lambda: _do(lambda: topo.clear(host)))


async def kv_path(cluster: LiveCluster, prefill: str, decode: str, *, latency: bool) -> NetworkFault:
    """Loss (or latency) on everything both ends of one prefill -> decode path send."""
    topo = hosts_of(cluster)

    def apply() -> None:
        for host in (prefill, decode):
            if latency:
                topo.latency(host, KV_LATENCY_MS, KV_JITTER_MS)
            else:
                topo.loss(host, KV_LOSS_PCT, egress=True)

    def undo() -> None:
        for host in (prefill, decode):
            topo.clear(host)

    try:
        await _do(apply)
    except NetnsUnavailable:
        await _do(undo)
        raise
    what = f"+{KV_LATENCY_MS:g} ms" if latency else f"{KV_LOSS_PCT}% loss"
    return NetworkFault(f"{prefill} <-> {decode} ({what})", lambda: _do(undo))
