"""`pdrelay trace [REQUEST_ID]`: one request's span tree with durations, from the trace sink of `pdrelay up --trace`.

    pdrelay trace                          the latest traced requests (id, total time, TTFT)
    pdrelay trace chatcmpl-9f2c...         the request's span tree across gateway, decode and prefill, and where
                                           its time to first token went
    pdrelay trace ID --spans FILE          read spans from FILE (JSON lines of shared.telemetry.sink) instead

The request id is the `id` of the OpenAI response (chat.completion / completion); it is on every span of the request
as `pdrelay.request_id`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace",
        help="print one request's span tree (needs `pdrelay up --trace`)",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("request_id", nargs="?", default=None, help="request id (omit to list the latest requests)")
    p.add_argument("--run-dir", default=None, help="the run dir of `pdrelay up --trace` (default: .run)")
    p.add_argument("--spans", default=None, metavar="FILE", help="span file to read instead of the run dir's")
    p.add_argument("--last", type=int, default=20, metavar="N", help="how many requests the listing shows")
    p.add_argument("--json", action="store_true", help="print the request's spans as JSON lines")
    p.set_defaults(_run=run)


def spans_file(run_dir: str | None, spans: str | None) -> Path:
    if spans:
        return Path(spans)
    from shared.cluster.localcluster.rundir import TRACES_FILE, default_run_dir

    return (Path(run_dir) if run_dir else default_run_dir()) / TRACES_FILE


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    import msgspec

    from shared.telemetry import tree

    if extra:
        print(f"pdrelay trace: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    path = spans_file(ns.run_dir, ns.spans)
    if not path.exists():
        print(
            f"pdrelay trace: no span file at {path}; start the cluster with `pdrelay up --trace` (or pass --spans "
            "FILE / --run-dir DIR)",
            file=sys.stderr,
        )
        return 1
    records = tree.load(path)
    if ns.request_id is None:
        rows = tree.requests(records)[-max(1, ns.last) :]
        if not rows:
            print(f"no traced requests in {path} yet")
            return 0
        print(f"{'started':<19} {'total ms':>9} {'TTFT ms':>8} {'spans':>5}  request")
        for r in rows:
            ttft = f"{r.ttft_ns / 1e6:8.2f}" if r.ttft_ns is not None else f"{'-':>8}"
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.start_ns / 1e9))
            print(
                f"{started:<19} {r.duration_ns / 1e6:9.2f} {ttft} {r.num_spans:5d}  {r.request_id or r.trace_id}"
                + ("  ERROR" if r.error else "")
            )
        return 0
    trace_ids = tree.traces_of_request(records, ns.request_id)
    if not trace_ids:
        print(
            f"pdrelay trace: no spans of request {ns.request_id!r} in {path} (spans arrive within about a second "
            "of the request; `pdrelay trace` without an id lists the traced requests)",
            file=sys.stderr,
        )
        return 1
    traces = tree.by_trace(records)
    for i, tid in enumerate(trace_ids):
        if ns.json:
            enc = msgspec.json.Encoder()
            for s in sorted(traces[tid], key=lambda s: s.start_ns):
                sys.stdout.write(enc.encode(s).decode() + "\n")
            continue
        if i:
            print()
        print(tree.render(traces[tid], ns.request_id))
    return 0
