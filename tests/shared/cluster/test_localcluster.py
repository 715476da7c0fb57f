"""`pdrelay up / status / scale / down` end to end, with the echo role, plus the planning logic on its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shared.cluster.localcluster import plan as plan_mod
from shared.cluster.localcluster.plan import UpOptions, build_spec, flags_for_role, plan, split_flags
from shared.cluster.localcluster.rundir import RunState, pid_alive, read_state
from shared.cluster.localcluster.servers import free_port
from shared.config import ConfigError

pytestmark = pytest.mark.timeout(120)


def pdrelay(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _ports() -> list[str]:
    # never the default 2379/4222: another cluster (or another test run) may be using them
    return ["--etcd-port", str(free_port()), "--nats-port", str(free_port())]


def _all_pids(state: RunState) -> list[int]:
    return [state.supervisor_pid, state.etcd_pid, state.nats_pid, *(c.pid for c in state.children)]


def _wait_gone(pids: list[int], timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if p and pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


# ---------------------------------------------------------------- planning (no processes)


def test_service_flags_go_to_the_roles_that_accept_them() -> None:
    argv = ["--page-size", "32", "--port", "8080", "--no-disable-radix-cache", "--bogus-flag", "x", "--model=d"]
    assert split_flags(argv) == [
        ["--page-size", "32"],
        ["--port", "8080"],
        ["--no-disable-radix-cache"],
        ["--bogus-flag", "x"],
        ["--model=d"],
    ]
    assert flags_for_role("decode", argv) == [
        "--page-size",
        "32",
        "--no-disable-radix-cache",
        "--bogus-flag",
        "x",
        "--model=d",
    ]
    assert flags_for_role("gateway", argv) == ["--port", "8080", "--bogus-flag", "x", "--model=d"]


def test_build_spec_writes_a_resolved_config_per_instance(tmp_path: Path) -> None:
    opts = UpOptions(run_dir=str(tmp_path), cluster="c1", extra=("--page-size", "32", "--port", "8123"))
    spec = build_spec("decode", 1, opts, "http://127.0.0.1:1", "nats://127.0.0.1:2", env={})
    assert spec.instance_id == "decode-2"
    assert spec.argv[1:5] == ("-m", "services.decode", "--resolved-config", spec.config_path)
    from shared.config import ResolvedConfig

    cfg = ResolvedConfig.from_json(Path(spec.config_path).read_text())
    assert cfg.cache.page_size == 32 and cfg.discovery.instance_id == "decode-2"
    assert cfg.discovery.cluster == "c1" and cfg.discovery.etcd_endpoints == ("http://127.0.0.1:1",)
    assert cfg.bus.nats_url == "nats://127.0.0.1:2" and cfg.grpc.grpc_port == 0
    gw = build_spec("gateway", 0, opts, "http://127.0.0.1:1", "nats://127.0.0.1:2", env={})
    assert ResolvedConfig.from_json(Path(gw.config_path).read_text()).http.port == 8123
    with pytest.raises(ConfigError, match="page-size"):
        build_spec(
            "decode",
            0,
            UpOptions(run_dir=str(tmp_path), extra=("--page-size", "12")),
            "http://h:1",
            "nats://h:2",
            env={},
        )


def test_engines_split_the_hosts_cores_by_default(tmp_path: Path) -> None:
    from shared.config import ResolvedConfig
    from shared.config.probe import HostProbe

    def threads(role: str, counts: dict[str, int], *extra: str) -> int:
        opts = UpOptions(run_dir=str(tmp_path), counts=counts, extra=extra)
        spec = build_spec(role, 0, opts, "http://127.0.0.1:1", "nats://127.0.0.1:2", env={})
        return ResolvedConfig.from_json(Path(spec.config_path).read_text()).device.threads

    cores = HostProbe().cpu_count()
    assert threads("worker", {"gateway": 1, "worker": 1}) == cores  # a lone worker beside a gateway: every core
    assert threads("decode", {"gateway": 1, "prefill": 1, "decode": 1}) == max(1, cores // 2)
    assert threads("worker", {"gateway": 1, "worker": 1}, "--threads", "1") == 1
    # the encoder `pdrelay up` starts by default is left out of the split and takes one thread
    colocated = {"gateway": 1, "worker": 1, "encoder": 1, "kvstore": 1}
    assert threads("worker", colocated) == cores
    assert threads("encoder", colocated) == 1
    assert threads("decode", {"gateway": 1, "prefill": 1, "decode": 1, "encoder": 1}) == max(1, cores // 2)


def test_role_flags_reach_only_their_role_and_win_over_shared_flags(tmp_path: Path) -> None:
    from shared.config import ResolvedConfig

    opts = UpOptions(
        run_dir=str(tmp_path),
        extra=("--num-pages", "500"),
        role_extra={"prefill": ("--num-pages", "160", "--page-size", "32")},
    )
    cfgs = {
        role: ResolvedConfig.from_json(
            Path(build_spec(role, 0, opts, "http://127.0.0.1:1", "nats://127.0.0.1:2", env={}).config_path).read_text()
        )
        for role in ("prefill", "decode")
    }
    assert (cfgs["prefill"].cache.num_pages, cfgs["prefill"].cache.page_size) == (160, 32)
    assert (cfgs["decode"].cache.num_pages, cfgs["decode"].cache.page_size) == (500, 16)
    with pytest.raises(ConfigError, match="routing-policy"):  # a flag the role does not take is an error there
        build_spec(
            "prefill",
            0,
            UpOptions(run_dir=str(tmp_path), role_extra={"prefill": ("--routing-policy", "x")}),
            "http://h:1",
            "nats://h:2",
            env={},
        )


def test_up_role_flags_are_parsed_and_checked() -> None:
    from services.commands.up import parse_role_flags

    assert parse_role_flags(["prefill=--num-pages 160", "decode=--page-size=32", "prefill=--threads 2"]) == {
        "prefill": ("--num-pages", "160", "--threads", "2"),
        "decode": ("--page-size=32",),
    }
    for bad in ("--num-pages 160", "nosuch=--num-pages 1", "prefill=", "prefill=160"):
        with pytest.raises(ValueError, match="role-flags"):
            parse_role_flags([bad])


def test_roles_missing_from_the_build_are_skipped_with_a_note(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(plan_mod, "role_available", lambda role: role == "echo")
    opts = UpOptions(run_dir=str(tmp_path), counts={"gateway": 1, "prefill": 2, "echo": 2})
    specs, notes = plan(opts, "http://127.0.0.1:1", "nats://127.0.0.1:2")
    assert [s.instance_id for s in specs] == ["echo-1", "echo-2"]
    assert len(notes) == 2 and any("prefill" in n and "2 instance" in n for n in notes)
    assert specs[0].argv[1:3] == ("-m", "services.echo")


def test_scale_targets_are_validated() -> None:
    from services.commands.scale import parse_targets

    assert parse_targets(["prefill=3", "decode=0"]) == {"prefill": 3, "decode": 0}
    for bad in ("prefill", "prefill=-1", "prefill=x", "nosuch=1"):
        with pytest.raises(ValueError):
            parse_targets([bad])


# ---------------------------------------------------------------- real clusters


@pytest.mark.e2e
def test_up_status_scale_down_detached(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    up = pdrelay(
        "up",
        "--detach",
        "--run-dir",
        run_dir,
        "--cluster",
        "e2e",
        "--gateway",
        "0",
        "--prefill",
        "0",
        "--decode",
        "0",
        "--encoder",
        "0",
        "--echo",
        "2",
        "--lease-ttl-s",
        "2",
        *_ports(),
    )
    state = read_state(Path(run_dir))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert state is not None and state.ready
        assert "is ready" in up.stdout and "echo-1" in up.stdout and "echo-2" in up.stdout
        assert [c.state for c in state.children] == ["ready", "ready"]

        st = pdrelay("status", "--run-dir", run_dir)
        assert st.returncode == 0, st.stderr
        lines = [ln for ln in st.stdout.splitlines() if ln.startswith("echo ")]
        assert len(lines) == 2 and all(" ready " in ln for ln in lines), st.stdout
        assert all(ln.split()[6] != "-" for ln in lines), f"no load reports in status:\n{st.stdout}"

        again = pdrelay("up", "--detach", "--run-dir", run_dir, "--echo", "1")
        assert again.returncode == 1 and "already running" in again.stderr

        sc = pdrelay("scale", "--run-dir", run_dir, "echo=3")
        assert sc.returncode == 0 and "done (echo=3)" in sc.stdout, sc.stdout + sc.stderr
        scaled = read_state(Path(run_dir))
        assert [c.instance_id for c in scaled.children] == ["echo-1", "echo-2", "echo-3"]
        extra_pids = [c.pid for c in scaled.children[1:]]
        sc = pdrelay("scale", "--run-dir", run_dir, "echo=1")
        assert sc.returncode == 0 and "draining" in sc.stdout, sc.stdout + sc.stderr
        st = pdrelay("status", "--run-dir", run_dir, "--json")
        import json

        rows = json.loads(st.stdout)["rows"]  # the drained instances deregistered
        assert [r["instance_id"] for r in rows] == ["echo-1"]
        state = read_state(Path(run_dir))
        assert [c.instance_id for c in state.children] == ["echo-1"]
        assert _wait_gone(extra_pids) == [], "drained instances did not exit"
    finally:
        down = pdrelay("down", "--run-dir", run_dir)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    assert _wait_gone(_all_pids(state)) == [], "processes left behind after pdrelay down"
    assert read_state(Path(run_dir)) is None
    assert "no cluster is running" in pdrelay("down", "--run-dir", run_dir).stdout


@pytest.mark.e2e
def test_up_foreground_streams_logs_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "up",
            "--run-dir",
            str(run_dir),
            "--gateway",
            "0",
            "--prefill",
            "0",
            "--decode",
            "0",
            "--encoder",
            "0",
            "--echo",
            "1",
            *_ports(),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if "is ready" in line:
                break
        assert any("is ready" in ln for ln in out), "".join(out)
        assert any(ln.startswith("echo-1      | ") for ln in out), "child logs are not streamed with a prefix"
        state = read_state(run_dir)
        assert state is not None
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, "".join(out) + rest
        assert "stopped" in rest
        assert _wait_gone(_all_pids(state)) == []
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.e2e
def test_killed_supervisor_leaves_no_process_behind(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    up = pdrelay(
        "up",
        "--detach",
        "--run-dir",
        run_dir,
        "--gateway",
        "0",
        "--prefill",
        "0",
        "--decode",
        "0",
        "--encoder",
        "0",
        "--echo",
        "1",
        *_ports(),
    )
    assert up.returncode == 0, up.stdout + up.stderr
    state = read_state(Path(run_dir))
    os.kill(state.supervisor_pid, signal.SIGKILL)
    assert _wait_gone(_all_pids(state)) == [], "children outlived a SIGKILLed supervisor"
    assert "no cluster is running" in pdrelay("status", "--run-dir", run_dir).stderr


def test_up_with_unreachable_external_etcd_is_a_clear_error(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    r = pdrelay(
        "up",
        "--run-dir",
        str(tmp_path / "run"),
        "--etcd",
        dead,
        "--gateway",
        "0",
        "--prefill",
        "0",
        "--decode",
        "0",
        "--encoder",
        "0",
        "--echo",
        "1",
        *_ports(),
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert dead in r.stdout and "pdrelay up" in r.stdout, r.stdout
    state = read_state(tmp_path / "run")
    assert state is not None and state.error and state.etcd_pid == 0 and state.nats_pid == 0, (
        "nothing may be started before the external etcd answered"
    )


def test_status_without_a_cluster_says_how_to_start_one(tmp_path: Path) -> None:
    r = pdrelay("status", "--run-dir", str(tmp_path))
    assert r.returncode == 1 and "pdrelay up" in r.stderr
    r = pdrelay("scale", "--run-dir", str(tmp_path), "prefill=2")
    assert r.returncode == 1 and "pdrelay up" in r.stderr
