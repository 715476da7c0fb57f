"""The servers `pdrelay bench serve --compare-peer` measures: pdrelay clusters (`pdrelay up` in the background) and a
peer (its start script in bench/), each started, waited for and stopped by a context manager that yields where to
send the workload and which processes to watch."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_S = 600.0
PEERS = {"vllm": "vllm_peer.sh"}  # peer name -> start script in bench/
BENCH_DIR = Path(__file__).resolve().parent.parent  # bench/ (this module lives in bench/serve/)
# vLLM's settings: its own core split or every core, each at its own --dtype auto (bf16 on a CPU with avx512_bf16)
# or at float32 (the comparison of the fp32 paths)
PEER_SETTINGS = {
    "vllm": {
        f"{cores}{suffix}": {"VLLM_PEER_CORES": cores, "VLLM_PEER_DTYPE": dtype}
        for cores in ("default", "all")
        for suffix, dtype in (("", "auto"), ("-fp32", "float32"))
    }
}
# What `pdrelay up --worker 1 --prefill 0 --decode 0` and a plain `pdrelay up` start: the encoder and the kvstore come
# with the engines there (services/commands/up.py), so they are here too. Measured without them the bench would show
# a cluster no user runs (the encoder took a core of the worker's split; the kvstore looks up and stores every
# request).
WITH_ENGINES = {"encoder": 1, "kvstore": 1}
SETUPS = {
    "colocated": {"gateway": 1, "worker": 1, **WITH_ENGINES},
    "cluster": {"gateway": 1, "prefill": 1, "decode": 1, **WITH_ENGINES},
}
# The same clusters with their engines at --dtype float32 (the defaults pick bf16 on a CPU with avx512_bf16)
SETUPS |= {f"{name}-fp32": counts for name, counts in list(SETUPS.items())}
SETUP_DTYPE = {name: "float32" for name in SETUPS if name.endswith("-fp32")}


@dataclass(frozen=True)
class Endpoint:
    """A running server: its label in the report, HTTP base URL, front pid (gateway / API server), engine pids, and
    for pdrelay each engine's metrics address (instance id -> host:port)."""

    label: str
    base_url: str
    pid: int | None
    worker_pids: tuple[int, ...] = ()
    engines: dict[str, str] = field(default_factory=dict)


def _log(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


@contextmanager
def pdrelay_server(
    setup: str, role_flags: dict[str, tuple[str, ...]], model_dir: Path, tmp: Path
) -> Iterator[Endpoint]:
    """`pdrelay up` with SETUPS[setup]'s services and their defaults (plus role_flags), on free ports."""
    from shared.cluster.handshake import read_ready_file
    from shared.cluster.localcluster import detached
    from shared.cluster.localcluster.plan import ENGINE_ROLES, UpOptions
    from shared.cluster.localcluster.servers import free_port

    run_dir = tmp / f"pdrelay-{setup}"
    if setup in SETUP_DTYPE:  # the engines' dtype; the other roles take no --dtype or do not use it
        engine_roles = [r for r in SETUPS[setup] if r in ENGINE_ROLES]
        role_flags = {**role_flags} | {r: (*role_flags.get(r, ()), "--dtype", SETUP_DTYPE[setup]) for r in engine_roles}
    opts = UpOptions(
        run_dir=str(run_dir),
        cluster=f"bench-{setup}",
        etcd_port=free_port(),
        nats_port=free_port(),
        counts=SETUPS[setup],
        extra=("--model", str(model_dir), "--port", str(free_port())),
        role_extra=role_flags,
        ready_timeout_s=READY_TIMEOUT_S,
        echo_log=False,
    )
    _log(f"pdrelay {setup}: starting {', '.join(f'{n} {r}' for r, n in SETUPS[setup].items())} in {run_dir}")
    t0 = time.monotonic()
    try:
        state = detached.start(opts)
        gateway = next(c for c in state.children if c.role == "gateway")
        workers = tuple(c.pid for c in state.children if c.role != "gateway")
        engines = {}
        for c in state.children:
            # the LLM engines' step counters (the kvstore and encoder serve /metrics too, without engine steps)
            info = read_ready_file(run_dir / "ready" / f"{c.instance_id}.json") if c.role in ENGINE_ROLES else None
            if info is not None and info.metrics:
                engines[c.instance_id] = info.metrics
        _log(f"pdrelay {setup}: ready in {time.monotonic() - t0:.0f} s on http://{gateway.http}")
        yield Endpoint(f"pdrelay-{setup}", f"http://{gateway.http}", gateway.pid, workers, engines)
    finally:
        detached.stop(run_dir, timeout_s=30.0, say=lambda m: _log(f"pdrelay {setup}: {m}"))


@contextmanager
def peer_server(peer: str, setting: str, peer_python: str, model_dir: Path) -> Iterator[Endpoint]:
    """The peer's start script (bench/PEERS[peer]) at one of its PEER_SETTINGS, from its own venv's python."""
    from bench.serve.peer import PeerProcess

    script = BENCH_DIR / PEERS[peer]
    env = {f"{peer.upper()}_PYTHON": peer_python, **PEER_SETTINGS[peer][setting]}
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = f"{assigns} exec {shlex.quote(str(script))} {{port}} {{pid_file}} {shlex.quote(str(model_dir))}"
    label = f"{peer}-{setting}"
    _log(f"{label}: starting {cmd}")
    proc = PeerProcess(cmd)
    try:
        t0 = time.monotonic()
        model = proc.wait_ready(READY_TIMEOUT_S)
        pids = proc.pids()
        for _ in range(50):  # the script names the engine processes right after the server first answers
            if pids["worker"]:
                break
            time.sleep(0.1)
            pids = proc.pids()
        _log(f"{label}: ready in {time.monotonic() - t0:.0f} s on {proc.base_url} ({model})")
        yield Endpoint(label, proc.base_url, pids["front"][0], pids["worker"])
    finally:
        proc.stop()
