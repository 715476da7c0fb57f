"""The chaos scenarios: what each one breaks, and how it is put right again (by itself, or by `pdrelay up`).

kill-<role>            SIGKILL one instance (the supervisor restarts it)
stop-<role>            SIGSTOP one instance for --hang-s, then SIGCONT (a hung process: alive, silent)
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.chaos.cluster import LiveCluster
    from shared.cluster.localcluster.rundir import ChildState


class Scenario(enum.StrEnum):
    KILL_DECODE = "kill-decode"
    KILL_PREFILL = "kill-prefill"
    KILL_GATEWAY = "kill-gateway"
    STOP_DECODE = "stop-decode"
    STOP_PREFILL = "stop-prefill"
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
HANG_SCENARIOS = frozenset({Scenario.STOP_DECODE, Scenario.STOP_PREFILL, Scenario.FAULT_PREFILL_HANG})
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
    if sc in (Scenario.KILL_DECODE, Scenario.KILL_PREFILL, Scenario.KILL_GATEWAY):
        child = _first(cluster, sc.value.removeprefix("kill-"))
        cluster.signal(child.pid, signal.SIGKILL)
        return Injected(child.instance_id)
    if sc in (Scenario.STOP_DECODE, Scenario.STOP_PREFILL):
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
        iid = f"chaos-{sc.value.removeprefix('fault-')}"
        proc = await asyncio.to_thread(cluster.start_faulty_prefill, _FAULTS[sc], iid)

        async def stop() -> None:
            await asyncio.to_thread(_stop, proc)

        return Injected(iid, cleanup=stop)
    if sc == Scenario.POISON:
        return Injected("requests")
    assert sc == Scenario.OVERLOAD
    return Injected("gateway")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
