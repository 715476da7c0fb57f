"""A local cluster in the background: `pdrelay up --detach` and `pdrelay down`, as functions for other callers
(benchmarks that start one cluster per configuration, back to back).

start() launches the supervisor (`python -m shared.cluster.localcluster --options FILE`) in its own session and
returns the run state once every instance is ready; stop() signals that supervisor, which stops its children,
and SIGKILLs whatever recorded process of ours is still there after the timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from shared.cluster.localcluster.netns_hosts import delete_leftover
from shared.cluster.localcluster.plan import UpOptions
from shared.cluster.localcluster.rundir import STATE_FILE, RunState, pid_alive, read_state, running_supervisor

SUPERVISOR_LOG = "supervisor.log"


class StartFailed(RuntimeError):
    """The supervisor exited before the cluster was ready (the message carries its log's tail)."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode


class NotReady(TimeoutError):
    """Not ready within the timeout; the supervisor (pid) is still running and trying."""

    def __init__(self, message: str, supervisor_pid: int) -> None:
        super().__init__(message)
        self.supervisor_pid = supervisor_pid


def start(opts: UpOptions, *, wait_s: float | None = None) -> RunState:
    """Start the cluster of `opts` in the background and return its state once ready.

    Raises ValueError when a live cluster already uses the run dir, StartFailed, or NotReady (after `wait_s`,
    default the options' ready timeout + 30 s)."""
    run_dir = Path(opts.run_dir)
    live = running_supervisor(run_dir)
    if live is not None:
        raise ValueError(
            f"a cluster is already running from {run_dir} (supervisor pid {live.supervisor_pid}); "
            f"stop it with `pdrelay down --run-dir {run_dir}`"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    opts_file = run_dir / "up-options.json"
    opts_file.write_bytes(msgspec.json.encode(opts))
    log_path = run_dir / SUPERVISOR_LOG
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shared.cluster.localcluster", "--options", str(opts_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + (opts.ready_timeout_s + 30 if wait_s is None else wait_s)
    while time.monotonic() < deadline:
        rc = proc.poll()
        state = read_state(run_dir)
        if state is not None and state.ready and state.supervisor_pid == proc.pid:
            return state
        if rc is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
            raise StartFailed(f"the supervisor exited with code {rc} before the cluster was ready:\n{tail}", rc)
        time.sleep(0.1)
    raise NotReady(
        f"not ready after {opts.ready_timeout_s:.0f} s; the supervisor (pid {proc.pid}) keeps trying; "
        f"see {log_path}, stop it with `pdrelay down --run-dir {run_dir}`",
        proc.pid,
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(pid: int) -> bool:
    """Only kill a recorded PID if it still runs one of our programs (PIDs get reused)."""
    cmd = _cmdline(pid)
    return any(mark in cmd for mark in ("services.", "shared.cluster", "etcd", "nats-server", "mooncake_master"))


def stop(run_dir: Path, *, timeout_s: float = 60.0, say: Callable[[str], None] | None = None) -> bool:
    """Stop the cluster of `run_dir`; False when none was recorded there. `say` gets progress lines."""
    tell = say or (lambda _msg: None)
    state = read_state(run_dir)  # ValueError when unreadable
    if state is None:
        return False
    pids = [state.supervisor_pid, *(c.pid for c in state.children), state.nats_pid, state.etcd_pid, state.mooncake_pid]
    if pid_alive(state.supervisor_pid):
        tell(f"stopping the cluster of {run_dir} (supervisor pid {state.supervisor_pid}) ...")
        os.kill(state.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    leftovers = [p for p in pids if p and pid_alive(p) and _ours(p)]
    for pid in leftovers:
        tell(f"pid {pid} did not stop in time; killing it")
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if delete_leftover(run_dir):  # `--netns` hosts of a supervisor that could not remove them
        tell("removed the cluster's network namespaces")
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    return True
