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
from typing import Any

from bench.planner_ramp import start_planner
from bench.scale_cluster import MockCluster, Phase, pdrelay, poisson_load
from bench.serve.metrics import RequestResult


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssSampler:
    """Samples the RSS of the gateway and the planner every `every_s` (from the start on) while a run lasts."""

    def __init__(self, gateway_pid: int, planner_pid: int, every_s: float) -> None:
        self.gateway_pid, self.planner_pid, self.every_s = gateway_pid, planner_pid, every_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            self.samples.append(
                {
                    "t_s": round(time.monotonic() - t0, 1),
                    "gateway_rss_mb": round(rss_mb(self.gateway_pid), 1),
                    "planner_rss_mb": round(rss_mb(self.planner_pid), 1),
                }
            )
            if self._stop.wait(self.every_s):
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.planner_soak", description=__doc__.splitlines()[0])
    p.add_argument("--prefill", type=int, default=16)
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--speedup", type=float, default=4.0)
    p.add_argument("--rate", type=float, default=6.0, help="requests per second")
    p.add_argument("--sample-s", type=float, default=20.0)
    p.add_argument("--run-dir", default="/tmp/pdrelay-planner-soak")
    p.add_argument("--out", default=None)
    return p


def _planner_flags(ns: argparse.Namespace) -> tuple[str, ...]:
    """Scale each role within the top quarter of its size: the planner decides all along, the cluster stays big."""
    lo_p, lo_d = max(1, ns.prefill * 3 // 4), max(1, ns.decode * 3 // 4)
    return (
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
        str(ns.prefill + ns.decode),
        "--ttft-target-ms",
        "2000",
        "--itl-target-ms",
        "100",
        "--planner-log-size",
        "1000",
    )


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
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
    planner = start_planner(cluster, _planner_flags(ns), run_dir / "planner-soak.log")
    gateway = next(c.pid for c in cluster.state.children if c.role == "gateway")
    sampler = RssSampler(gateway, planner.pid, ns.sample_s)
    sampler.start()
    seconds = ns.minutes * 60
    # prompts alternate short and long every minute, so the planner keeps deciding
    phases = [Phase(60, ns.rate, 64 if i % 2 == 0 else 512, 48) for i in range(int(seconds // 60))]
    try:
        results = asyncio.run(poisson_load(cluster.url, phases, seed=11))
    finally:
        sampler.stop()
        decisions = cluster.cli("planner", "log", "--json", "--last", "100000").stdout.splitlines()[1:]
        planner.terminate()
        planner.wait(30)
        cluster.down()
    report = _report(ns, startup_s, results, len(decisions), sampler.samples)
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    for s in sampler.samples:
        print(f"  t={s['t_s']:6.0f}s gateway {s['gateway_rss_mb']:7.1f} MB  planner {s['planner_rss_mb']:7.1f} MB")
    if ns.out:
        Path(ns.out).write_text(json.dumps(report, indent=1))
    return 0


def _report(
    ns: argparse.Namespace,
    startup_s: float,
    results: list[tuple[float, RequestResult]],
    decisions: int,
    samples: list[dict[str, float]],
) -> dict[str, Any]:
    """The run's JSON: requests, decisions logged, and the RSS growth from the second sample (after warm-up)."""
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    return {
        "instances": ns.prefill + ns.decode,
        "speedup": ns.speedup,
        "wall_minutes": ns.minutes,
        "simulated_minutes": ns.minutes * ns.speedup,
        "cluster_startup_s": round(startup_s, 1),
        "requests": len(results),
        "succeeded": sum(r.success for _, r in results),
        "decisions_logged": decisions,
        "samples": samples,
        "gateway_rss_growth_mb": round(last["gateway_rss_mb"] - first["gateway_rss_mb"], 1),
        "planner_rss_growth_mb": round(last["planner_rss_mb"] - first["planner_rss_mb"], 1),
    }


if __name__ == "__main__":
    sys.exit(main())
