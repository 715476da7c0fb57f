"""`pdrelay chaos`: its pieces on their own, then the command itself on a small live cluster (`pdrelay up` on a tiny
model: a gateway, one prefill, two decodes) with three short scenarios."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.chaos.cluster import is_loopback
from services.chaos.load import Outcome, Verdict, rejudge, seeded_prompts
from services.chaos.report import ChaosReport, ScenarioResult, format_table, tally
from services.chaos.scenarios import ALL, Scenario, parse_scenarios
from shared.cluster.localcluster.rundir import ChildState, RunState, write_state
from shared.cluster.localcluster.servers import free_port
from shared.cluster.localcluster.service_process import OFFLINE_ENV


def pdrelay(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **OFFLINE_ENV}
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_scenarios_are_a_closed_set() -> None:
    assert parse_scenarios("all") == list(ALL)
    assert parse_scenarios("stop-decode, kill-prefill") == [Scenario.STOP_DECODE, Scenario.KILL_PREFILL]
    with pytest.raises(ValueError, match="unknown scenario 'stop-dekode'; choose from all, kill-decode"):
        parse_scenarios("stop-dekode")


async def test_network_scenarios_need_a_cluster_of_hosts(tmp_path: Path) -> None:
    """On a cluster whose instances share one network, partitions and loss do not apply (and say why)."""
    from services.chaos.cluster import LiveCluster
    from services.chaos.scenarios import NETWORK_SCENARIOS, NotApplicable, inject

    write_state(
        tmp_path,
        RunState(
            supervisor_pid=os.getpid(),
            cluster="c",
            etcd_url="http://127.0.0.1:1",
            nats_url="nats://127.0.0.1:1",
            run_dir=str(tmp_path),
            started_at=0.0,
            children=[ChildState(role=r, instance_id=f"{r}-1", pid=1, state="ready") for r in ("prefill", "decode")],
        ),
    )
    assert len(NETWORK_SCENARIOS) == 6
    for sc in NETWORK_SCENARIOS:
        with pytest.raises(NotApplicable, match="pdrelay up --netns"):
            await inject(sc, LiveCluster(tmp_path))


def test_loopback_detection() -> None:
    assert is_loopback("http://127.0.0.1:2379") and is_loopback("127.0.0.5:50051") and is_loopback("localhost:1")
    assert is_loopback("http://[::1]:8000")
    assert not is_loopback("http://10.1.2.3:2379") and not is_loopback("nats://192.168.0.7:4222")


def test_seeded_prompts_and_judging() -> None:
    assert seeded_prompts(3, 4) == seeded_prompts(3, 4) != seeded_prompts(4, 4)
    ok = Outcome(Verdict.CORRECT, 0.0, 1.0, "", "p", "Paris")
    assert rejudge(ok, "Paris") is ok
    assert rejudge(ok, "Lyon").verdict == Verdict.WRONG
    refused = Outcome(Verdict.CLEAR, 0.0, 1.0, "429 overloaded", "p")
    assert rejudge(refused, "Paris") is refused


def test_tally_table_and_targets() -> None:
    outcomes = [
        Outcome(Verdict.CORRECT, 0.0, 2.0),
        Outcome(Verdict.CORRECT, 5.0, 12.0),
        Outcome(Verdict.CLEAR, 6.0, 7.0, "503 unavailable: no decode"),
    ]
    r = tally(ScenarioResult(scenario="stop-decode", answer_within_s=10.0, recovery_s=8.0), outcomes, fault_at=4.0)
    assert (r.sent, r.correct, r.clear_errors, r.hung, r.wrong) == (3, 2, 1, 0, 0)
    assert r.slowest_after_fault_s == 7.0 and r.ok  # the 5 -> 12 s request: 7 s after it was sent
    late = tally(ScenarioResult(scenario="stop-decode", answer_within_s=5.0, recovery_s=8.0), outcomes, 4.0)
    assert not late.ok
    never = ScenarioResult(scenario="kill-decode", recovery_s=None)
    report = ChaosReport(
        cluster="c",
        seed=0,
        duration_s=10,
        concurrency=2,
        max_tokens=8,
        scenarios=[r, never, ScenarioResult(scenario="etcd-outage", skipped="external etcd")],
    )
    table = format_table(report)
    assert "stop-decode" in table and "7.0 (<= 10)" in table and "never" in table and "skipped: external" in table
    assert "1 x 503 unavailable: no decode" in table
    assert not report.ok and "FAILED" in table


def test_refuses_a_cluster_off_loopback(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_state(
        run_dir,
        RunState(
            supervisor_pid=os.getpid(),
            cluster="c",
            etcd_url="http://10.0.0.5:2379",
            nats_url="nats://127.0.0.1:4222",
            run_dir=str(run_dir),
            started_at=time.time(),
            children=[ChildState(role="gateway", instance_id="gateway-1", pid=1, state="ready", http="127.0.0.1:8000")],
        ),
    )
    r = pdrelay("chaos", "--run-dir", str(run_dir), "--scenarios", "stop-decode")
    assert r.returncode == 2 and "off loopback (http://10.0.0.5:2379)" in r.stderr and "--allow-remote" in r.stderr
    r = pdrelay("chaos", "--run-dir", str(run_dir), "--duration", "5", "--fault-after-s", "9")
    assert r.returncode == 2 and "--fault-after-s 9.0 must be shorter than --duration 5.0" in r.stderr


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_on_a_small_cluster(tmp_path: Path) -> None:
    from tests.helpers.tiny_models import make_tiny_model

    model = make_tiny_model(tmp_path / "models", "llama")
    run_dir = str(tmp_path / "run")
    up = pdrelay(
        "up",
        "--detach",
        "--run-dir",
        run_dir,
        "--port",
        str(free_port()),
        "--etcd-port",
        str(free_port()),
        "--nats-port",
        str(free_port()),
        "--model",
        str(model),
        "--prefill",
        "1",
        "--decode",
        "2",
        "--threads",
        "1",
        "--num-pages",
        "1024",
        "--lease-ttl-s",
        "3",
        "--quiet",
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        out = tmp_path / "chaos.json"
        r = pdrelay(
            "chaos",
            "--run-dir",
            run_dir,
            "--scenarios",
            "stop-decode,nats-outage,poison",
            "--duration",
            "8",
            "--fault-after-s",
            "1.5",
            "--hang-s",
            "6",
            "--concurrency",
            "3",
            "--max-tokens",
            "8",
            "--leak-timeout-s",
            "40",
            "--json",
            str(out),
            timeout=400,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "stop-decode" in r.stdout and "result: every scenario" in r.stdout
        res = json.loads(out.read_text())
        assert res["ok"] and [s["scenario"] for s in res["scenarios"]] == ["stop-decode", "nats-outage", "poison"]
        for s in res["scenarios"]:
            assert s["sent"] > 0 and s["correct"] > 0 and s["wrong"] == s["hung"] == s["leaked_pages"] == 0, s
            assert s["recovery_s"] is not None
        poison = res["scenarios"][2]  # ordinary and unusual requests all answered, none refused
        assert poison["clear_errors"] == 0 and poison["correct"] == poison["sent"], poison
        assert poison["sent"] > 3, poison
        stop = res["scenarios"][0]
        assert stop["target"] == "decode-1" and stop["slowest_after_fault_s"] <= 10, stop
    finally:
        down = pdrelay("down", "--run-dir", run_dir)
        assert down.returncode == 0, down.stdout + down.stderr
