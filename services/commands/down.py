"""`pdrelay down`: stop the local cluster of a run directory (signals its supervisor, which stops the rest)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "down", help="stop the local cluster started by `pdrelay up`", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--run-dir", default=None, help="the run dir given to `pdrelay up` (default: .run)")
    p.add_argument(
        "--timeout-s", type=float, default=60.0, help="wait this long for a clean stop, then SIGKILL whatever is left"
    )
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    from shared.cluster.localcluster.detached import stop
    from shared.cluster.localcluster.rundir import default_run_dir

    if extra:
        print(f"pdrelay down: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    run_dir = Path(ns.run_dir) if ns.run_dir else default_run_dir()
    try:
        stopped = stop(run_dir, timeout_s=ns.timeout_s, say=lambda msg: print(f"pdrelay down: {msg}", flush=True))
    except ValueError as e:
        print(f"pdrelay down: {e}", file=sys.stderr)
        return 1
    if not stopped:
        print(f"pdrelay down: no cluster is running from {run_dir}")
        return 0
    print("pdrelay down: stopped")
    return 0
