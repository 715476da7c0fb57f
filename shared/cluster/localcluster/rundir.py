"""The run directory of a local cluster: who runs it (supervisor PID), where etcd/NATS are, which children exist.

    <run-dir>/state.json        RunState, rewritten atomically on every change (read by down / status / scale)
    <run-dir>/supervisor.log    the supervisor's own output when detached
    <run-dir>/logs/<id>.log     each child's stdout + stderr
    <run-dir>/config/<id>.json  each child's resolved config
    <run-dir>/etcd, nats/       server data and logs (when `pdrelay up` started them)
    <run-dir>/traces/spans.jsonl  spans of every request, one JSON object per line (`pdrelay up --trace`)

Default: `.run/` in the current directory (override with --run-dir or $PDRELAY_RUN_DIR).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from shared.cluster.tls import TlsFiles

STATE_FILE = "state.json"
TRACES_FILE = "traces/spans.jsonl"


class ChildState(msgspec.Struct, kw_only=True):
    role: str
    instance_id: str
    pid: int
    state: str = "starting"  # starting | ready | draining | exited
    grpc: str = ""
    http: str = ""
    epoch: int = 0
    log: str = ""
    config: str = ""  # resolved config file (empty for the echo test service)
    restarts: int = 0  # times the supervisor started it again after a crash


class RunState(msgspec.Struct, kw_only=True):
    supervisor_pid: int
    cluster: str
    etcd_url: str
    nats_url: str
    run_dir: str
    started_at: float
    ready: bool = False
    etcd_pid: int = 0  # 0: an external etcd we did not start
    nats_pid: int = 0
    etcd_restarts: int = 0
    nats_restarts: int = 0
    mooncake_master: str = ""  # the kvstore's Mooncake Store master we started (HOST:PORT); "" when none
    mooncake_pid: int = 0
    children: list[ChildState] = msgspec.field(default_factory=list)
    skipped: list[str] = msgspec.field(default_factory=list)  # notes about roles not started
    traces: str = ""  # the span file of the trace sink (`pdrelay up --trace`); "" when tracing is off
    trace_endpoint: str = ""  # the sink's OTLP/gRPC endpoint, which every service exports to
    trace_sink_pid: int = 0
    error: str = ""  # why the supervisor gave up, when it did
    tls_dir: str = ""  # `pdrelay up --tls`: the CA and certificates (etcd, NATS and gRPC are mutual TLS)
    admin_secret_file: str = ""  # the secret that signs drain / scale commands on NATS (shared.cluster.bus.admin_auth)
    netns: str = ""  # `pdrelay up --netns`: the client host's namespace, where commands talking to the cluster run


def default_run_dir() -> Path:
    return Path(os.environ.get("PDRELAY_RUN_DIR") or ".run")


def write_state(run_dir: Path, state: RunState) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state)))
    tmp.replace(run_dir / STATE_FILE)


def read_state(run_dir: Path) -> RunState | None:
    try:
        return msgspec.json.decode((run_dir / STATE_FILE).read_bytes(), type=RunState)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"{run_dir / STATE_FILE} is unreadable ({e}); if no cluster is running, delete it") from None


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by its parent) is not alive for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def running_supervisor(run_dir: Path) -> RunState | None:
    """The state of a live supervisor using `run_dir`, or None (no state, or its supervisor is gone)."""
    state = read_state(run_dir)
    if state is None or not pid_alive(state.supervisor_pid):
        return None
    return state


def client_tls(state: RunState) -> TlsFiles | None:
    """The identity command-line tools use on a `pdrelay up --tls` cluster (its "client" certificate)."""
    if not state.tls_dir:
        return None
    d = Path(state.tls_dir)
    return TlsFiles.load(str(d / "ca.pem"), str(d / "client.pem"), str(d / "client-key.pem"))
