"""The chaos scenarios: what each one breaks, and how it is put right again (by itself, or by `pdrelay up`).

kill-<role>            SIGKILL one instance (the supervisor restarts it); kill-kvstore mid-load, kill-encoder with
                       embedding requests in the load (judged against the healthy cluster's vectors)
kill-decode-rank       SIGKILL one tensor-parallel rank (not rank 0) of a decode at --tp-size > 1: the instance must
                       end itself (its streams replayed elsewhere) and come back whole
stop-<role>            SIGSTOP one instance for --hang-s, then SIGCONT (a hung process: alive, silent)
mooncake-master-down   SIGKILL the kvstore's Mooncake Store master (the supervisor restarts it): its T3 is gone
partition-<role>, loss-oneway-prefill, kv-loss, kv-latency
                       the network between hosts of a `pdrelay up --netns` cluster (services/chaos/network.py)
etcd-outage            SIGKILL etcd (the supervisor restarts it with its data directory)
nats-outage            SIGKILL nats-server (restarted the same way)
fault-prefill-<fault>  one more prefill with --fault-injection prefill_<fault> joins for the scenario
overload               a burst of --overload-requests at once on top of the load
poison                 requests with unusual but valid parameters (logit_bias, penalties, min_tokens, stop ids,
                       seeded top-k/top-p/min-p with n > 1, a grammar, logprobs + echo) mixed into the load: each
                       must be answered, and every ordinary request must complete correctly (no clear errors either)
"""

from __future__ import annotations

import asyncio
import enum
import signal
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.chaos.cluster import LiveCluster
    from shared.cluster.localcluster.rundir import ChildState


class Scenario(enum.StrEnum):
    KILL_DECODE = "kill-decode"
    KILL_DECODE_RANK = "kill-decode-rank"
    KILL_PREFILL = "kill-prefill"
    KILL_GATEWAY = "kill-gateway"
    STOP_DECODE = "stop-decode"
    STOP_PREFILL = "stop-prefill"
    KILL_KVSTORE = "kill-kvstore"
    STOP_KVSTORE = "stop-kvstore"
    MOONCAKE_MASTER_DOWN = "mooncake-master-down"
    KILL_ENCODER = "kill-encoder"
    PARTITION_PREFILL = "partition-prefill"
    PARTITION_DECODE = "partition-decode"
    PARTITION_KVSTORE = "partition-kvstore"
    LOSS_ONEWAY_PREFILL = "loss-oneway-prefill"
    KV_LOSS = "kv-loss"
    KV_LATENCY = "kv-latency"
    ETCD_OUTAGE = "etcd-outage"
    NATS_OUTAGE = "nats-outage"
    FAULT_PREFILL_HANG = "fault-prefill-hang"
    FAULT_PREFILL_CORRUPT = "fault-prefill-corrupt"
    FAULT_PREFILL_CRASH = "fault-prefill-crash"
    OVERLOAD = "overload"
    POISON = "poison"


ALL = tuple(Scenario)
# No fault but the requests themselves: not even a clear error is acceptable for an ordinary request.
STRICT_SCENARIOS = frozenset({Scenario.POISON})
# Hangs: every request must still be answered (served elsewhere, or refused clearly) soon after the fault.
HANG_SCENARIOS = frozenset(
    {
        Scenario.STOP_DECODE,
        Scenario.STOP_PREFILL,
        Scenario.STOP_KVSTORE,
        Scenario.FAULT_PREFILL_HANG,
        Scenario.PARTITION_PREFILL,
        Scenario.PARTITION_DECODE,
        Scenario.PARTITION_KVSTORE,
    }
)
# The network between hosts: a `pdrelay up --netns` cluster only.
NETWORK_SCENARIOS = frozenset(
    {
        Scenario.PARTITION_PREFILL,
        Scenario.PARTITION_DECODE,
        Scenario.PARTITION_KVSTORE,
        Scenario.LOSS_ONEWAY_PREFILL,
        Scenario.KV_LOSS,
        Scenario.KV_LATENCY,
    }
)
_KILLS = (
    Scenario.KILL_DECODE,
    Scenario.KILL_PREFILL,
    Scenario.KILL_GATEWAY,
    Scenario.KILL_KVSTORE,
    Scenario.KILL_ENCODER,
)
_STOPS = (Scenario.STOP_DECODE, Scenario.STOP_PREFILL, Scenario.STOP_KVSTORE)
_FAULTS = {
    Scenario.FAULT_PREFILL_HANG: "prefill_hang",
    Scenario.FAULT_PREFILL_CORRUPT: "prefill_corrupt_checksum",
    Scenario.FAULT_PREFILL_CRASH: "prefill_crash_mid_transfer",
}


def parse_scenarios(text: str) -> list[Scenario]:
    """'all' or a comma-separated list; ValueError naming an unknown one and the choices."""
    if text.strip() == "all":
        return list(ALL)
    out = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        try:
            out.append(Scenario(name))
        except ValueError:
            raise ValueError(f"--scenarios: unknown scenario {name!r}; choose from all, {', '.join(ALL)}") from None
    if not out:
        raise ValueError("--scenarios is empty; name at least one (or 'all')")
    return out


@dataclass
class Injected:
    target: str
    heal: Callable[[], Awaitable[None]] | None = None  # run after --hang-s (stop-*)
    cleanup: Callable[[], Awaitable[None]] | None = None  # run once the scenario is over (fault-*)


class NotApplicable(Exception):
    """The scenario cannot run on this cluster (no such role, an external etcd, ...)."""


def _first(cluster: LiveCluster, role: str) -> ChildState:
    live = sorted((c for c in cluster.children(role) if c.state == "ready"), key=lambda c: c.instance_id)
    if not live:
        raise NotApplicable(f"no ready {role} instance")
    return live[0]


async def inject(sc: Scenario, cluster: LiveCluster) -> Injected:
    """Break what the scenario breaks, now. Raises NotApplicable."""
    if sc in NETWORK_SCENARIOS:
        return await _network(sc, cluster)
    if sc == Scenario.KILL_DECODE_RANK:
        return _kill_rank(cluster, "decode")
    if sc in _KILLS:
        child = _first(cluster, sc.value.removeprefix("kill-"))
        cluster.signal(child.pid, signal.SIGKILL)
        return Injected(child.instance_id)
    if sc == Scenario.MOONCAKE_MASTER_DOWN:
        state = cluster.state()
        if not state.mooncake_pid:
            raise NotApplicable("no Mooncake master was started by `pdrelay up` (no kvstore, or an external one)")
        cluster.signal(state.mooncake_pid, signal.SIGKILL)
        return Injected(f"mooncake_master {state.mooncake_master}")
    if sc in _STOPS:
        child = _first(cluster, sc.value.removeprefix("stop-"))
        cluster.signal(child.pid, signal.SIGSTOP)

        async def cont() -> None:
            cluster.signal(child.pid, signal.SIGCONT)

        return Injected(child.instance_id, heal=cont)
    if sc in (Scenario.ETCD_OUTAGE, Scenario.NATS_OUTAGE):
        name = sc.value.removesuffix("-outage")
        pid = getattr(cluster.state(), f"{name}_pid")
        if not pid:
            raise NotApplicable(f"{name} was not started by `pdrelay up` (an external server is not ours to kill)")
        cluster.signal(pid, signal.SIGKILL)
        return Injected(name)
    if sc in _FAULTS:
        _first(cluster, "prefill")  # there is a prefill tier to join
        if cluster.topology() is not None:
            raise NotApplicable("a faulty prefill joins on the supervisor's host, which --netns keeps for clients")
        iid = f"chaos-{sc.value.removeprefix('fault-')}"
        proc = await asyncio.to_thread(cluster.start_faulty_prefill, _FAULTS[sc], iid)

        async def stop() -> None:
            await asyncio.to_thread(_stop, proc)

        return Injected(iid, cleanup=stop)
    if sc == Scenario.POISON:
        return Injected("requests")
    assert sc == Scenario.OVERLOAD
    return Injected("gateway")


def _kill_rank(cluster: LiveCluster, role: str) -> Injected:
    """SIGKILL rank 1 of the first ready instance of `role` that runs more than one rank."""
    for child in sorted((c for c in cluster.children(role) if c.state == "ready"), key=lambda c: c.instance_id):
        ranks = follower_pids(child.pid)
        if ranks:
            cluster.signal(ranks[0], signal.SIGKILL)
            return Injected(child.instance_id)
    raise NotApplicable(f"no ready {role} instance runs more than one tensor-parallel rank (--tp-size 1)")


def follower_pids(pid: int) -> list[int]:
    """The follower ranks under process `pid` (rank 0 starts them as `python -m shared.engine.parallel.follower`),
    in start order; [] at --tp-size 1. Read from /proc: ranks are children of rank 0, whatever wraps it."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for kid in sorted(parents.get(todo.pop(), ())):
            try:
                cmd = (Path("/proc") / str(kid) / "cmdline").read_bytes()
            except OSError:
                continue
            if b"shared.engine.parallel.follower" in cmd:
                out.append(kid)
            todo.append(kid)
    return sorted(out)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def _network(sc: Scenario, cluster: LiveCluster) -> Injected:
    """A fault between hosts, undone after --hang-s (heal)."""
    from services.chaos import network
    from shared.cluster.netns import NetnsUnavailable

    try:
        network.hosts_of(cluster)  # first: a cluster without hosts is the reason, whatever runs on it
        if sc in (Scenario.PARTITION_PREFILL, Scenario.PARTITION_DECODE, Scenario.PARTITION_KVSTORE):
            fault = await network.partition(cluster, _first(cluster, sc.value.removeprefix("partition-")).instance_id)
        elif sc == Scenario.LOSS_ONEWAY_PREFILL:
            fault = await network.one_way_loss(cluster, _first(cluster, "prefill").instance_id)
        else:
            prefill, decode = _first(cluster, "prefill").instance_id, _first(cluster, "decode").instance_id
            fault = await network.kv_path(cluster, prefill, decode, latency=sc == Scenario.KV_LATENCY)
    except NetnsUnavailable as e:
        raise NotApplicable(str(e)) from None
    return Injected(fault.target, heal=fault.undo)
