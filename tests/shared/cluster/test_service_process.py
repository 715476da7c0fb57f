"""ServiceProcess on small Python children: the ready line, an early exit, a timeout, SIGTERM then SIGKILL, the
HTTP probe, a process group stopped whole, the offline environment."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from shared.cluster.localcluster.servers import free_port
from shared.cluster.localcluster.service_process import (
    OFFLINE_ENV,
    ServiceProcess,
    http_ok,
    python_cmd,
    service_env,
    stop_all,
    wait_all_ready,
)

READY = {
    "event": "ready",
    "role": "worker",
    "instance_id": "w-1",
    "cluster": "c",
    "grpc": "127.0.0.1:1",
    "epoch": 3,
    "pid": 1,
}


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_ready_line_on_stdout_after_other_output(tmp_path: Path) -> None:
    code = f"import sys, time; print('loading'); print({json.dumps(json.dumps(READY))}, flush=True); time.sleep(60)"
    with ServiceProcess("w-1", _child(code), tmp_path) as p:
        p.wait_ready(30)
        assert p.ready is not None and p.ready.instance_id == "w-1" and p.ready.epoch == 3
        assert p.alive() and p.out_path.read_text().startswith("loading")
    assert not p.alive() and p.returncode == -signal.SIGTERM


def test_exit_before_ready_names_the_code_and_the_log(tmp_path: Path) -> None:
    p = ServiceProcess("bad", _child("import sys; sys.stderr.write('no model here\\n'); sys.exit(3)"), tmp_path)
    with pytest.raises(RuntimeError, match=r"bad exited with code 3 before it was ready:\nno model here"):
        p.wait_ready(30)


def test_timeout_names_the_late_ones_and_stop_all_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    ignore = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        "sys.stderr.write('stuck\\n'); sys.stderr.flush(); time.sleep(60)"
    )
    procs = [ServiceProcess("slow-1", _child(ignore), tmp_path), ServiceProcess("slow-2", _child(ignore), tmp_path)]
    with pytest.raises(TimeoutError, match=r"not ready within 1 s: \['slow-1', 'slow-2'\](.|\n)*stuck"):
        wait_all_ready(procs, 1.0)
    t0 = time.monotonic()
    assert stop_all(procs, 0.5) == {"slow-1": -signal.SIGKILL, "slow-2": -signal.SIGKILL}
    assert time.monotonic() - t0 < 10


def test_http_probe_and_a_temporary_log_dir() -> None:
    port = free_port()
    server = python_cmd("http.server", "--bind", "127.0.0.1", str(port))
    p = ServiceProcess("web", server, probe=http_ok(f"http://127.0.0.1:{port}/"), merge_output=True)
    try:
        p.wait_ready(30)
        assert p.ready is None  # no handshake line: the probe alone said ready
    finally:
        p.stop()
    assert not p.log_dir.exists()


def test_new_session_stops_the_whole_group(tmp_path: Path) -> None:
    # A shell that starts a grandchild and reports its pid: stopping the shell's group ends the grandchild too.
    pid_file = tmp_path / "grandchild.pid"
    cmd = ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"]
    p = ServiceProcess(
        "group",
        cmd,
        tmp_path,
        new_session=True,
        probe=lambda _: pid_file.exists() and pid_file.read_text().strip() != "",
    )
    p.wait_ready(30)
    grandchild = int(pid_file.read_text())
    p.stop(5.0)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(grandchild):
        time.sleep(0.05)
    assert not _running(grandchild)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (reaped by init later) is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_children_get_the_offline_env(tmp_path: Path) -> None:
    env = service_env(EXTRA="x")
    assert {k: env[k] for k in OFFLINE_ENV} == dict(OFFLINE_ENV) and env["OMP_NUM_THREADS"] == "1"
    code = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('HF_HUB_OFFLINE', "
        "'TOKENIZERS_PARALLELISM', 'OMP_NUM_THREADS', 'EXTRA')}), flush=True)"
    )
    p = ServiceProcess("env", _child(code), tmp_path, env=env)
    assert p.proc.wait(30) == 0
    assert json.loads(p.out_path.read_text()) == {
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "EXTRA": "x",
    }
