"""`pdrelay chaos`: rehearse failures on a live local cluster (`pdrelay up`) under a bounded, seeded load.

Each scenario (kill / stop a gateway, prefill or decode; etcd and NATS outages; faults injected with
--fault-injection; overload) runs for --duration seconds of load; its row says how many requests were sent, answered
correctly (the same greedy text as the healthy cluster's), refused or failed clearly, hung or answered wrong, how
many KV pages stayed taken, and how long the cluster took to recover. The table is printed and written as JSON.
Exit status 0 when every scenario had 0 wrong, 0 hung, 0 leaked pages and recovered; 1 otherwise.

It kills and stops the cluster's processes: run it on a staging cluster, never on one serving users.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_POSITIVE = (
    "duration",
    "fault_after_s",
    "hang_s",
    "request_timeout_s",
    "recovery_timeout_s",
    "leak_timeout_s",
    "answer_within_s",
)
_COUNTS = ("concurrency", "max_tokens", "prompts", "overload_requests")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from services.chaos.scenarios import ALL

    p = sub.add_parser(
        "chaos",
        help="fault scenarios against a running local cluster, with a results table",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run-dir", default=None, help="the run dir of `pdrelay up` (default: .run)")
    p.add_argument("--scenarios", default="all", help=f"comma-separated, or 'all' (default): {', '.join(ALL)}")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per scenario (default 30)")
    p.add_argument("--fault-after-s", type=float, default=5.0, help="seconds into the load the fault hits")
    p.add_argument("--hang-s", type=float, default=12.0, help="how long stop-* scenarios keep the process stopped")
    p.add_argument("--concurrency", type=int, default=4, help="clients sending requests back to back")
    p.add_argument("--max-tokens", type=int, default=16, help="greedy tokens per request")
    p.add_argument("--prompts", type=int, default=12, help="distinct seeded prompts")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the request order")
    p.add_argument("--request-timeout-s", type=float, default=60.0, help="a request unanswered by then is hung")
    p.add_argument("--recovery-timeout-s", type=float, default=180.0, help="give up waiting for recovery then")
    p.add_argument(
        "--leak-timeout-s",
        type=float,
        default=45.0,
        help="how long pages may stay taken once idle (covers hand-off quarantines)",
    )
    p.add_argument("--overload-requests", type=int, default=128, help="burst size of the overload scenario")
    p.add_argument(
        "--answer-within-s",
        type=float,
        default=10.0,
        help="hang scenarios: every request answered within this long after the fault",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        default=None,
        metavar="PATH",
        help="where to write the results (default: <run-dir>/chaos/results.json)",
    )
    p.add_argument("--api-key", default=None, help="the gateway's --api-key, if it has one")
    p.add_argument(
        "--allow-remote", action="store_true", help="run although the cluster has endpoints off this machine's loopback"
    )
    p.set_defaults(_run=run)


def _check(ns: argparse.Namespace) -> None:
    for name in _POSITIVE:
        if getattr(ns, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0 (got {getattr(ns, name)})")
    for name in _COUNTS:
        if getattr(ns, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(ns, name)})")
    if ns.fault_after_s >= ns.duration:
        raise ValueError(f"--fault-after-s {ns.fault_after_s} must be shorter than --duration {ns.duration}")


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    import asyncio

    import msgspec

    from services.chaos.cluster import LiveCluster
    from services.chaos.report import format_table
    from services.chaos.runner import ChaosOptions, run_chaos
    from services.chaos.scenarios import parse_scenarios
    from shared.cluster.localcluster.netns_hosts import enter_cluster
    from shared.cluster.localcluster.rundir import default_run_dir

    if extra:
        print(f"pdrelay chaos: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    try:
        _check(ns)
        scenarios = parse_scenarios(ns.scenarios)
        run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
        cluster = LiveCluster(run_dir)
        remote = cluster.remote_endpoints()
        cluster.gateway_url()
    except ValueError as e:
        print(f"pdrelay chaos: error: {e}", file=sys.stderr)
        return 2
    if remote and not ns.allow_remote:
        print(
            f"pdrelay chaos: the cluster has endpoints off loopback ({', '.join(remote[:3])}); chaos kills and "
            "stops processes, so it runs only against a local cluster unless you pass --allow-remote",
            file=sys.stderr,
        )
        return 2
    opts = ChaosOptions(
        run_dir=run_dir,
        scenarios=tuple(scenarios),
        duration_s=ns.duration,
        fault_after_s=ns.fault_after_s,
        hang_s=ns.hang_s,
        concurrency=ns.concurrency,
        max_tokens=ns.max_tokens,
        prompts=ns.prompts,
        seed=ns.seed,
        request_timeout_s=ns.request_timeout_s,
        recovery_timeout_s=ns.recovery_timeout_s,
        leak_timeout_s=ns.leak_timeout_s,
        overload_requests=ns.overload_requests,
        answer_within_s=ns.answer_within_s,
        api_key=ns.api_key,
    )
    try:
        enter_cluster(run_dir, cluster.state().netns)  # `pdrelay up --netns`: talk to it from its client host
        report = asyncio.run(run_chaos(opts))
    except (RuntimeError, ValueError, OSError) as e:
        print(f"pdrelay chaos: error: {e}", file=sys.stderr)
        return 1
    print(format_table(report))
    out = Path(ns.json_path) if ns.json_path else run_dir / "chaos" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode({**msgspec.to_builtins(report), "ok": report.ok})))
    print(f"results: {out}")
    return 0 if report.ok else 1
