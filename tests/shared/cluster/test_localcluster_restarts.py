"""`pdrelay up` supervises: crashed children, etcd and nats-server come back (with backoff), `pdrelay status` counts
the restarts, and `--no-restart` only reports. Real processes (the echo role, etcd, NATS), SIGKILLed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from shared.cluster.localcluster.restarts import RestartPolicy, Restarts
from shared.cluster.localcluster.rundir import RunState, pid_alive, read_state
from tests.shared.cluster.test_localcluster import _all_pids, _ports, _wait_gone, pdrelay

pytestmark = pytest.mark.timeout(180)


def test_backoff_doubles_while_crashing_and_resets_after_a_stable_run() -> None:
    now = [0.0]
    r = Restarts(RestartPolicy(initial_s=1.0, max_s=8.0, stable_s=60.0), clock=lambda: now[0])
    r.started("decode-1")
    assert [r.crashed("decode-1") for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    r.started("decode-1")
    now[0] += 61  # up for a minute: the next crash starts the backoff again
    assert r.crashed("decode-1") == 1.0
    assert r.count("decode-1") == 6 and r.count("etcd") == 0


def _wait_state(run_dir: str, pred, timeout: float, what: str) -> RunState:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state(Path(run_dir))
        if state is not None and pred(state):
            return state
        time.sleep(0.2)
    raise AssertionError(
        f"{what}: not within {timeout} s; state: {read_state(Path(run_dir))}\n"
        f"{(Path(run_dir) / 'supervisor.log').read_text(errors='replace')[-3000:]}"
    )


@pytest.mark.e2e
def test_crashed_child_etcd_and_nats_are_restarted_and_counted(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    up = pdrelay(
        "up",
        "--detach",
        "--run-dir",
        run_dir,
        "--cluster",
        "restarts",
        "--gateway",
        "0",
        "--prefill",
        "0",
        "--decode",
        "0",
        "--echo",
        "1",
        "--lease-ttl-s",
        "2",
        *_ports(),
    )
    state = read_state(Path(run_dir))
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert state is not None
        pids = _all_pids(state)
        child_pid = state.children[0].pid
        os.kill(child_pid, signal.SIGKILL)
        state = _wait_state(
            run_dir,
            lambda s: (
                s.children
                and s.children[0].restarts == 1
                and s.children[0].state == "ready"
                and s.children[0].pid != child_pid
            ),
            30,
            "echo-1 restarted",
        )
        pids.append(state.children[0].pid)

        for name in ("etcd", "nats"):
            old = getattr(state, f"{name}_pid")
            os.kill(old, signal.SIGKILL)
            state = _wait_state(
                run_dir,
                lambda s, n=name, o=old: (
                    getattr(s, f"{n}_restarts") == 1
                    and getattr(s, f"{n}_pid") not in (0, o)
                    and pid_alive(getattr(s, f"{n}_pid"))
                ),
                30,
                f"{name} restarted",
            )
            pids.append(getattr(state, f"{name}_pid"))

        # the instance re-registers in the restarted etcd (same data dir) and the status shows the counts
        deadline = time.monotonic() + 30
        while True:
            st = pdrelay("status", "--run-dir", run_dir)
            if st.returncode == 0 and any(ln.startswith("echo ") for ln in st.stdout.splitlines()):
                break
            assert time.monotonic() < deadline, st.stdout + st.stderr
            time.sleep(0.5)
        assert "restarts (pdrelay up): etcd 1, nats 1, echo-1 1" in st.stdout, st.stdout
    finally:
        down = pdrelay("down", "--run-dir", run_dir)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _wait_gone(pids) == [], "processes left behind after pdrelay down"


@pytest.mark.e2e
def test_no_restart_only_reports(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    up = pdrelay(
        "up",
        "--detach",
        "--no-restart",
        "--run-dir",
        run_dir,
        "--gateway",
        "0",
        "--prefill",
        "0",
        "--decode",
        "0",
        "--echo",
        "1",
        *_ports(),
    )
    state = read_state(Path(run_dir))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert state is not None
        os.kill(state.children[0].pid, signal.SIGKILL)
        os.kill(state.nats_pid, signal.SIGKILL)
        log = Path(run_dir) / "supervisor.log"
        deadline = time.monotonic() + 20
        while "nats exited unexpectedly" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        time.sleep(2.0)  # longer than the first backoff: nothing came back
        text = log.read_text(errors="replace")
        assert "echo-1 exited unexpectedly" in text and "not restarted (--no-restart)" in text
        after = read_state(Path(run_dir))
        assert after is not None and after.children[0].state == "exited" and after.children[0].restarts == 0
    finally:
        down = pdrelay("down", "--run-dir", run_dir)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _wait_gone(_all_pids(state)) == []
