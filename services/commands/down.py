"""`pdrelay down`: stop the local cluster of a run directory (signals its supervisor, which stops the rest)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("down", help="stop the local cluster started by `pdrelay up`", description=__doc__,
                       allow_abbrev=False)
    p.add_argument("--run-dir", default=None, help="the run dir given to `pdrelay up` (default: .run)")
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="wait this long for a clean stop, then SIGKILL whatever is left")
    p.set_defaults(_run=run)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(pid: int) -> bool:
    """Only kill a recorded PID if it still runs one of our programs (PIDs get reused)."""
    cmd = _cmdline(pid)
    return any(mark in cmd for mark in ("services.", "shared.cluster", "etcd", "nats-server"))


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    from shared.cluster.localcluster.rundir import default_run_dir, pid_alive, read_state

    if extra:
        print(f"pdrelay down: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
    try:
        state = read_state(run_dir)
    except ValueError as e:
        print(f"pdrelay down: {e}", file=sys.stderr)
        return 1
    if state is None:
        print(f"pdrelay down: no cluster is running from {run_dir}")
        return 0
    pids = [state.supervisor_pid, *(c.pid for c in state.children), state.nats_pid, state.etcd_pid]
    if pid_alive(state.supervisor_pid):
        print(f"pdrelay down: stopping the cluster of {run_dir} (supervisor pid {state.supervisor_pid}) ...")
        os.kill(state.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + ns.timeout_s
        while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    leftovers = [p for p in pids if p and pid_alive(p) and _ours(p)]
    for pid in leftovers:
        print(f"pdrelay down: pid {pid} did not stop in time; killing it", file=sys.stderr)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    (run_dir / "state.json").unlink(missing_ok=True)
    print("pdrelay down: stopped")
    return 0
