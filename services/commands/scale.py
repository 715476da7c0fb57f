"""`pdrelay scale prefill=3 decode=2`: ask the local cluster's supervisor to start or drain instances."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scale",
        help="add or drain instances: pdrelay scale prefill=2 decode=3",
        description=__doc__,
        allow_abbrev=False,
    )
    p.add_argument("targets", nargs="+", metavar="ROLE=N", help="wanted number of instances per role")
    p.add_argument("--run-dir", default=None, help="the run dir of `pdrelay up` (default: .run)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long to wait for the new size")
    p.add_argument("--no-wait", action="store_true", help="return once the supervisor accepted the request")
    p.set_defaults(_run=run)


def parse_targets(items: list[str]) -> dict[str, int]:
    from shared.cluster.localcluster.plan import ROLE_ORDER

    out: dict[str, int] = {}
    for item in items:
        role, eq, n = item.partition("=")
        if not eq or not n.strip().isdigit():
            raise ValueError(f"{item!r}: write ROLE=N, e.g. prefill=2")
        if role not in ROLE_ORDER:
            raise ValueError(f"{item!r}: unknown role {role!r}; choose from {', '.join(ROLE_ORDER)}")
        out[role] = int(n)
    return out


def _settled(state, targets: dict[str, int]) -> bool:  # state: RunState
    for role, want in targets.items():
        mine = [c for c in state.children if c.role == role and c.state != "exited"]
        if len(mine) != want or any(c.state != "ready" for c in mine):
            return False
    return True


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    import asyncio

    from shared.cluster.bus.admin_auth import AdminAuth
    from shared.cluster.bus.client import Bus
    from shared.cluster.bus.scale import request_scale
    from shared.cluster.errors import ControlPlaneUnavailable
    from shared.cluster.localcluster.netns_hosts import enter_cluster
    from shared.cluster.localcluster.rundir import client_tls, default_run_dir, read_state, running_supervisor

    if extra:
        print(f"pdrelay scale: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    try:
        targets = parse_targets(ns.targets)
    except ValueError as e:
        print(f"pdrelay scale: error: {e}", file=sys.stderr)
        return 2
    run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
    state = running_supervisor(run_dir)
    if state is None:
        print(f"pdrelay scale: no cluster is running from {run_dir}; start one with `pdrelay up`", file=sys.stderr)
        return 1

    async def ask():  # -> ScaleReply
        auth = AdminAuth.from_file(state.admin_secret_file) if state.admin_secret_file else None
        async with Bus(state.nats_url, name="pdrelay-scale", tls=client_tls(state)) as bus:
            return await request_scale(bus, state.cluster, targets, timeout_s=30, auth=auth)

    try:
        enter_cluster(run_dir, state.netns)  # `pdrelay up --netns`: talk to it from its client host
        reply = asyncio.run(ask())
    except (ControlPlaneUnavailable, TimeoutError) as e:
        print(f"pdrelay scale: the supervisor did not answer: {e}", file=sys.stderr)
        return 1
    if not reply.ok:
        print(f"pdrelay scale: refused: {reply.message}", file=sys.stderr)
        return 2
    print(
        f"pdrelay scale: {reply.message}"
        + (f"; starting {', '.join(reply.started)}" if reply.started else "")
        + (f"; draining {', '.join(reply.draining)}" if reply.draining else "")
    )
    if ns.no_wait:
        return 0
    deadline = time.monotonic() + ns.timeout_s
    while time.monotonic() < deadline:
        now = read_state(run_dir)
        if now is None:
            print("pdrelay scale: the cluster stopped meanwhile", file=sys.stderr)
            return 1
        if _settled(now, targets):
            sizes = ", ".join(f"{r}={n}" for r, n in targets.items())
            print(f"pdrelay scale: done ({sizes})")
            return 0
        time.sleep(0.2)
    print(
        f"pdrelay scale: not settled after {ns.timeout_s:.0f} s; see `pdrelay status --run-dir {run_dir}`",
        file=sys.stderr,
    )
    return 1
