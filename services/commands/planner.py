"""`pdrelay planner log` (the leading planner's recent decisions, with their reasons and numbers; --follow for
new ones as they happen) and `pdrelay planner unpin ROLE` (hand a role pinned by a manual scale back to it)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "planner", help="the planner's decisions (log) and manual pins (unpin)", description=__doc__, allow_abbrev=False
    )
    p.add_argument("action", choices=("log", "unpin"))
    p.add_argument("role", nargs="?", default="", help="unpin: prefill or decode (default: both)")
    p.add_argument("--run-dir", default=None, help="the run dir of `pdrelay up` (default: .run)")
    p.add_argument("--nats-url", default=None, help="NATS of the cluster (instead of --run-dir)")
    p.add_argument("--cluster", default="default", help="cluster name with --nats-url")
    p.add_argument("--last", type=int, default=30, help="log: how many recent decisions")
    p.add_argument("--follow", action="store_true", help="log: then print new decisions until Ctrl-C")
    p.add_argument("--json", action="store_true", help="one JSON object per decision")
    p.set_defaults(_run=run)


def format_decision(d) -> str:  # d: Decision
    when = time.strftime("%H:%M:%S", time.localtime(d.ts))
    nums = " ".join(f"{k}={v:g}" for k, v in sorted(d.numbers.items()))
    return f"{when} #{d.seq:<4} {d.role:<8} {d.action.value:<10} {d.current}->{d.target}  {d.reason}" + (
        f"\n{'':21}{nums}" if nums else ""
    )


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    import asyncio

    import msgspec

    from shared.cluster.bus.client import Bus
    from shared.cluster.bus.planner import ControlKind, PlannerControl, request_control, subscribe_decisions
    from shared.cluster.errors import ControlPlaneUnavailable
    from shared.cluster.localcluster.rundir import default_run_dir, running_supervisor

    if extra:
        print(f"pdrelay planner: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    if ns.last < 0:
        print(f"pdrelay planner: --last must be >= 0 (got {ns.last})", file=sys.stderr)
        return 2
    if ns.nats_url:
        url, cluster = ns.nats_url, ns.cluster
    else:
        run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
        state = running_supervisor(run_dir)
        if state is None:
            print(
                f"pdrelay planner: no cluster is running from {run_dir}; give --run-dir or --nats-url", file=sys.stderr
            )
            return 1
        url, cluster = state.nats_url, state.cluster

    def show(d) -> None:
        print(msgspec.json.encode(d).decode() if ns.json else format_decision(d), flush=True)

    async def go() -> int:
        async with Bus(url, name="pdrelay-planner-cli") as bus:
            kind = ControlKind.LOG if ns.action == "log" else ControlKind.UNPIN
            try:
                reply = await request_control(bus, cluster, PlannerControl(kind=kind, role=ns.role, last=ns.last))
            except TimeoutError:
                print(
                    "pdrelay planner: no planner is leading this cluster (start one: `pdrelay up --planner` or "
                    "`pdrelay serve planner`)",
                    file=sys.stderr,
                )
                return 1
            if not reply.ok:
                print(f"pdrelay planner: {reply.message}", file=sys.stderr)
                return 2
            if ns.action == "unpin":
                print(f"pdrelay planner: {reply.message} (leader {reply.planner})")
                return 0
            print(f"# leader {reply.planner}; pins: {reply.pins or 'none'}", flush=True)
            for d in reply.decisions:
                show(d)
            if ns.follow:
                await subscribe_decisions(bus, cluster, lambda d, meta: show(d))
                await asyncio.Event().wait()
        return 0

    try:
        return asyncio.run(go())
    except ControlPlaneUnavailable as e:
        print(f"pdrelay planner: {e}", file=sys.stderr)
        return 1
