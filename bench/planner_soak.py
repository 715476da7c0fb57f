"""Planner and gateway memory over a long simulated run at cluster size (bench/RESULTS.md, "Planner").

    python -m bench.planner_soak [--prefill 16 --decode 16] [--minutes 8] [--speedup 4]

A mock cluster of --prefill + --decode instances, one planner (scaling each role within the top quarter of its
size, so it evaluates and decides all along while the cluster stays near full size), and a steady Poisson
load with prompts of varying length; every --sample-s the RSS of the gateway and of the planner is read from
/proc. With --speedup S the engines run S times faster than the table: M minutes simulate M x S minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bench.planner_ramp import start_planner
from bench.scale_cluster import MockCluster, Phase, pdrelay, poisson_load


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.planner_soak", description=__doc__.splitlines()[0])
    p.add_argument("--prefill", type=int, default=16)
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--speedup", type=float, default=4.0)
    p.add_argument("--rate", type=float, default=6.0, help="requests per second")
    p.add_argument("--sample-s", type=float, default=20.0)
    p.add_argument("--run-dir", default="/tmp/pdrelay-planner-soak")
    p.add_argument("--out", default=None)
    ns = p.parse_args(argv)
    run_dir = Path(ns.run_dir)
    pdrelay("down", "--run-dir", str(run_dir))
    t_start = time.monotonic()
    cluster = MockCluster(
        run_dir,
        "--prefill",
        str(ns.prefill),
        "--decode",
        str(ns.decode),
        "--mock-speedup",
        str(ns.speedup),
        "--load-report-interval-s",
        "0.2",
    )
    startup_s = time.monotonic() - t_start
    n = ns.prefill + ns.decode
    lo_p, lo_d = max(1, ns.prefill * 3 // 4), max(1, ns.decode * 3 // 4)  # scale within the top quarter
    planner = start_planner(
        cluster,
        (
            "--evaluation-interval-s",
            "2",
            "--min-prefill",
            str(lo_p),
            "--min-decode",
            str(lo_d),
            "--max-prefill",
            str(ns.prefill),
            "--max-decode",
            str(ns.decode),
            "--budget",
            str(n),
            "--ttft-target-ms",
            "2000",
            "--itl-target-ms",
            "100",
            "--planner-log-size",
            "1000",
        ),
        run_dir / "planner-soak.log",
    )
    gateway = next(c.pid for c in cluster.state.children if c.role == "gateway")
    samples: list[dict[str, float]] = []
    stop = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while True:
            samples.append(
                {
                    "t_s": round(time.monotonic() - t0, 1),
                    "gateway_rss_mb": round(rss_mb(gateway), 1),
                    "planner_rss_mb": round(rss_mb(planner.pid), 1),
                }
            )
            if stop.wait(ns.sample_s):
                return

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    seconds = ns.minutes * 60
    # prompts alternate short and long every minute, so the planner keeps deciding
    phases = [Phase(60, ns.rate, 64 if i % 2 == 0 else 512, 48) for i in range(int(seconds // 60))]
    try:
        results = asyncio.run(poisson_load(cluster.url, phases, seed=11))
    finally:
        stop.set()
        th.join()
        decisions = cluster.cli("planner", "log", "--json", "--last", "100000").stdout.splitlines()[1:]
        planner.terminate()
        planner.wait(30)
        cluster.down()
    ok = sum(r.success for _, r in results)
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    report = {
        "instances": n,
        "speedup": ns.speedup,
        "wall_minutes": ns.minutes,
        "simulated_minutes": ns.minutes * ns.speedup,
        "cluster_startup_s": round(startup_s, 1),
        "requests": len(results),
        "succeeded": ok,
        "decisions_logged": len(decisions),
        "samples": samples,
        "gateway_rss_growth_mb": round(last["gateway_rss_mb"] - first["gateway_rss_mb"], 1),
        "planner_rss_growth_mb": round(last["planner_rss_mb"] - first["planner_rss_mb"], 1),
    }
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    for s in samples:
        print(f"  t={s['t_s']:6.0f}s gateway {s['gateway_rss_mb']:7.1f} MB  planner {s['planner_rss_mb']:7.1f} MB")
    if ns.out:
        Path(ns.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
