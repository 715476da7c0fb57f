"""`pdrelay status`: the instances of a cluster (from etcd) with their latest load (from NATS)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status", help="list the instances of a running cluster", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--run-dir", default=None, help="the run dir of `pdrelay up` (default: .run)")
    p.add_argument("--etcd", dest="etcd_url", default=None, metavar="URL", help="query this etcd instead")
    p.add_argument("--nats", dest="nats_url", default=None, metavar="URL", help="load reports from this NATS")
    p.add_argument("--cluster", default=None, help="cluster name (default: the run dir's, else 'default')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--load-window-s", type=float, default=0.6, help="how long to listen for load reports")
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    import asyncio

    import msgspec

    from shared.cluster.errors import ControlPlaneUnavailable
    from shared.cluster.localcluster.netns_hosts import enter_cluster
    from shared.cluster.localcluster.rundir import client_tls, default_run_dir, running_supervisor
    from shared.cluster.status import collect_status, format_table

    if extra:
        print(f"pdrelay status: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
    etcd_url, nats_url, cluster = ns.etcd_url, ns.nats_url, ns.cluster
    tls = None
    state = None
    if etcd_url is None:
        try:
            state = running_supervisor(run_dir)
        except ValueError as e:
            print(f"pdrelay status: {e}", file=sys.stderr)
            return 1
        if state is None:
            print(
                f"pdrelay status: no cluster is running from {run_dir}; start one with `pdrelay up`, or pass "
                "--etcd URL (and --nats URL) of a running cluster",
                file=sys.stderr,
            )
            return 1
        etcd_url, nats_url, cluster = state.etcd_url, nats_url or state.nats_url, cluster or state.cluster
        tls = client_tls(state)
    try:
        if state is not None:
            enter_cluster(run_dir, state.netns)  # `pdrelay up --netns`: talk to it from its client host
        status = asyncio.run(
            collect_status(
                etcd_url,
                nats_url or "nats://127.0.0.1:4222",
                cluster or "default",
                load_window_s=ns.load_window_s,
                tls=tls,
            )
        )
    except ControlPlaneUnavailable as e:
        print(f"pdrelay status: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a malformed --etcd / --nats URL
        print(f"pdrelay status: {e}", file=sys.stderr)
        return 2
    if state is not None:  # what the supervisor restarted, etcd and NATS first
        status.restarts = {
            "etcd": state.etcd_restarts,
            "nats": state.nats_restarts,
            **{c.instance_id: c.restarts for c in state.children},
        }
    print(msgspec.json.format(msgspec.json.encode(status)).decode() if ns.json else format_table(status))
    return 0
