"""The planner on a local cluster of mock engines (real etcd, NATS, gateway, supervisor; two planners, one leads):
load breaks the TTFT target -> prefill scales up; idle -> it scales down again (drained); a manual `pdrelay scale`
pins a role until `pdrelay planner unpin`; a live planner takes over when the leader is killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from bench.scale_cluster import MockCluster, poisson_load

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

PLANNER_FLAGS = (
    "--planner",
    "2",
    "--evaluation-interval-s",
    "1",
    "--ttft-target-ms",
    "800",
    "--itl-target-ms",
    "400",
    "--scale-up-cooldown-s",
    "2",
    "--scale-down-cooldown-s",
    "3",
    "--max-prefill",
    "3",
    "--max-decode",
    "2",
    "--budget",
    "5",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = MockCluster(tmp_path_factory.mktemp("planner") / "run", "--prefill", "1", "--decode", "1", *PLANNER_FLAGS)
    yield c
    c.down()


def decisions(cluster: MockCluster) -> tuple[str, list[dict]]:
    out = cluster.cli("planner", "log", "--json", "--last", "500")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    leader = lines[0].split()[2].rstrip(";")
    return leader, [json.loads(line) for line in lines[1:]]


def leader_now(cluster: MockCluster) -> str | None:
    """The leading planner, or None while nobody leads (between the old leader's lease and the new one)."""
    out = cluster.cli("planner", "log", "--last", "0")
    return out.stdout.splitlines()[0].split()[2].rstrip(";") if out.returncode == 0 else None


def find(cluster: MockCluster, role: str, action: str, after: int = 0) -> list[dict]:
    return [d for d in decisions(cluster)[1] if d["role"] == role and d["action"] == action and d["seq"] > after]


def test_load_scales_prefill_up_and_idle_scales_it_down(cluster: MockCluster) -> None:
    start = max((d["seq"] for d in decisions(cluster)[1]), default=0)
    # 384-token prompts take ~1 s each on one mock prefill: 3 per second queue up far past the 800 ms target
    results = asyncio.run(poisson_load(cluster.url, [(8.0, 3.0, 384, 8)], seed=1))
    assert all(r.success for _, r in results), [r.error for _, r in results if not r.success][:3]
    ups = find(cluster, "prefill", "scale_up", start)
    assert ups, decisions(cluster)[1][-10:]
    up = ups[0]
    assert up["numbers"]["est_ttft_ms"] > 800 and up["target"] > up["current"] >= 1
    assert "> target 800 ms" in up["reason"]
    cluster.wait("a second prefill instance ready", lambda: len(cluster.children("prefill")) >= 2, timeout=90)
    down = cluster.wait(
        "prefill drained back once idle", lambda: find(cluster, "prefill", "scale_down", up["seq"]), timeout=90
    )
    assert down[0]["drain"] and "draining" in down[0]["reason"]
    assert not find(cluster, "decode", "scale_up", start), "decode kept its ITL: it should not have grown"


def test_manual_scale_is_a_pin_until_unpinned(cluster: MockCluster) -> None:
    sc = cluster.cli("scale", "decode=2")
    assert sc.returncode == 0, sc.stdout + sc.stderr
    pinned = cluster.wait("the planner pins decode", lambda: find(cluster, "decode", "pinned"), timeout=30)
    assert pinned[0]["target"] == 2 and "by hand" in pinned[0]["reason"]
    seq = pinned[-1]["seq"]
    cluster.wait("decode=2 ready", lambda: len(cluster.children("decode")) == 2, timeout=90)
    # idle and over its need, but pinned: the planner leaves it alone for several evaluations
    asyncio.run(asyncio.sleep(6))
    assert not find(cluster, "decode", "scale_down", seq) and len(cluster.children("decode")) == 2
    un = cluster.cli("planner", "unpin", "decode")
    assert un.returncode == 0 and "unpinned decode" in un.stdout, un.stdout + un.stderr
    cluster.wait(
        "decode scaled back down after the unpin", lambda: find(cluster, "decode", "scale_down", seq), timeout=60
    )


def test_a_live_planner_takes_over_when_the_leader_dies(cluster: MockCluster) -> None:
    leader, _ = decisions(cluster)
    pid = next(c.pid for c in cluster.state.children if c.instance_id == leader)
    os.kill(pid, signal.SIGKILL)

    def live_leader() -> str | None:
        # Once the dead leader's lease lapses, the standby and the supervisor's restart of the dead one (same id,
        # new lease) both campaign, and either may create the key first; a process that is not the killed one leads.
        got = leader_now(cluster)
        if got is None:
            return None
        pids = [c.pid for c in cluster.state.children if c.instance_id == got]
        return got if pids and pid not in pids else None

    other = cluster.wait("a live planner leads", live_leader, timeout=30)
    assert other.startswith("planner-")
    # the cluster kept serving at its size meanwhile
    results = asyncio.run(poisson_load(cluster.url, [(1.0, 3.0, 64, 4)], seed=2))
    assert all(r.success for _, r in results)
