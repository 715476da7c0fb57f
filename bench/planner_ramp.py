"""The planner against fixed splits on a load ramp over one mock cluster (bench/RESULTS.md, "Planner").

    python -m bench.planner_ramp [--budget 8] [--speedup 4] [--out ramp.json]

One cluster of mock engines (`pdrelay up --engine mock`); for each configuration the cluster is scaled to its
split (`pdrelay scale`), settles, and takes the same ramp (same seed): the fixed 1P1D, every fixed split of the
budget in --splits, and the planner (started on the cluster for its run only, from 1P1D). Reported per run:
goodput (requests meeting both the TTFT and the ITL target, vLLM's definition with TPOT as the ITL measure),
failures, instance-seconds; for the planner its decisions, how fast it reacted (from the first request that was
late to the scale-up of its role, in evaluation intervals) and whether a scale-down lost a request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.scale_cluster import MockCluster, Phase, pdrelay, poisson_load
from bench.serve.metrics import RequestResult

# (scheduled arrival offset s, result) per request of a ramp, in arrival order
RampResults = list[tuple[float, RequestResult]]
# one line of `pdrelay planner log --json`: role, action, current, target, reason, numbers, ts
Decision = dict[str, Any]

# Short prompts with long answers (decode-heavy: ~1 prefill + 5 decode) -> long prompts with short answers
# (prefill-heavy: ~4 prefill + 1-2 decode) -> back, each phase lasting long enough (30-60 s, three minutes in all)
# for a scale-up to pay for the ~5 s an instance takes to start on two cores: with a budget of 6 no fixed split
# serves both halves. Rates are for engines at the table's speed (--speedup 1); --speedup S multiplies them by S
# and divides the targets by S (the same ramp, time-compressed).
RAMPS = {
    "minutes": (
        Phase(30, 0.5, 32, 96, rate_end=5.0),
        Phase(45, 5.0, 32, 96),
        Phase(60, 1.2, 768, 8),
        Phase(45, 5.0, 32, 96, rate_end=0.5),
    ),
    # the first, 90-second ramp: its long-prompt phase (2 req/s of 768 tokens, ~1.5k prompt tokens a second)
    # needs more prefill than the whole budget, so no split serves it and every shift costs a quarter of a phase
    "short": (
        Phase(15, 0.5, 32, 96, rate_end=4.0),
        Phase(25, 5.0, 32, 96),
        Phase(30, 2.0, 768, 8),
        Phase(20, 5.0, 32, 96, rate_end=0.5),
    ),
}


def compressed(ramp: Sequence[Phase], speedup: float) -> tuple[Phase, ...]:
    return tuple(
        Phase(p.seconds, p.rate * speedup, p.isl, p.osl, None if p.rate_end is None else p.rate_end * speedup)
        for p in ramp
    )


# The same shape, scaled down for real engines on the bundled model (two CPU cores): the smoke check that the
# planner decides the same way on real engines as on mock ones.
SMOKE_RAMP = (
    Phase(20, 0.5, 32, 24),
    Phase(40, 1.5, 384, 4),
    Phase(30, 0.5, 32, 24),
)


def run_planner(
    cluster: MockCluster,
    ramp: Sequence[Phase],
    seed: int,
    flags: Sequence[str],
    interval_s: float,
    ttft_ms: float,
    itl_ms: float,
) -> dict[str, Any]:
    """The ramp with a planner on the cluster (from its current size); the planner runs for this ramp only."""
    planner = start_planner(cluster, flags, cluster.run_dir / "planner-bench.log")
    try:
        time.sleep(interval_s * 2)
        t0 = time.time()
        with InstanceSeconds(cluster) as inst:
            res = run_ramp(cluster, ramp, seed)
        time.sleep(interval_s)
        decisions = planner_decisions(cluster)
    finally:
        planner.terminate()
        planner.wait(30)
    acts = [d for d in decisions if d["action"] in ("scale_up", "scale_down", "failed")]
    return {
        **goodput(res, ttft_ms, itl_ms),
        "instance_s": inst.total,
        "decisions": [
            {k: d[k] for k in ("role", "action", "current", "target", "reason")} | {"t": round(d["ts"] - t0, 1)}
            for d in acts
        ],
        "all_decisions": [
            {k: d[k] for k in ("role", "action", "current", "target", "reason", "numbers")}
            | {"t": round(d["ts"] - t0, 1)}
            for d in decisions
        ],
        "reaction_intervals": reaction_intervals(res, decisions, t0, interval_s, ttft_ms, itl_ms),
        "window_reaction_intervals": window_reaction_intervals(res, decisions, t0, interval_s, ttft_ms, itl_ms),
        "t0_unix": t0,
        "requests_detail": [(round(at, 3), r.success, round(r.ttft_s, 4), round(r.tpot_s, 5)) for at, r in res],
        "sizes": inst.samples,
    }


def smoke(ns: argparse.Namespace) -> int:
    """The scaled-down ramp with the planner on real engines, then on mock engines (no speedup): both decision
    sequences side by side."""
    flags = planner_flags(ns, "4", "3", "2")
    report: dict[str, Any] = {}
    for engine in ("real", "mock"):
        run_dir = Path(ns.run_dir + "-" + engine)
        pdrelay("down", "--run-dir", str(run_dir))
        cluster = MockCluster(run_dir, "--prefill", "1", "--decode", "1", engine=engine)
        try:
            report[engine] = run_planner(cluster, SMOKE_RAMP, ns.seed, flags, ns.interval_s, ns.ttft_ms, ns.itl_ms)
        finally:
            cluster.down()
        r = report[engine]
        print(
            f"{engine}: {r['requests']} requests, {r['failed']} failed, good {r['good']}, "
            f"mean TTFT {r['mean_ttft_ms']:.0f} ms, TPOT {r['mean_tpot_ms']:.0f} ms",
            flush=True,
        )
        print_decisions(r["decisions"], 140)
    if ns.out:
        Path(ns.out).write_text(json.dumps(report, indent=1))
    return 0


def goodput(results: RampResults, ttft_ms: float, itl_ms: float) -> dict[str, float]:
    ok = [r for _, r in results if r.success]
    good = [r for r in ok if r.ttft_s * 1e3 <= ttft_ms and r.tpot_s * 1e3 <= itl_ms]
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "good": len(good),
        "ttft_ok": sum(r.ttft_s * 1e3 <= ttft_ms for r in ok),
        "itl_ok": sum(r.tpot_s * 1e3 <= itl_ms for r in ok),
        "mean_ttft_ms": 1e3 * sum(r.ttft_s for r in ok) / max(1, len(ok)),
        "mean_tpot_ms": 1e3 * sum(r.tpot_s for r in ok) / max(1, len(ok)),
    }


class InstanceSeconds:
    """Samples the cluster's live prefill/decode counts every second while a run lasts."""

    def __init__(self, cluster: MockCluster) -> None:
        self.cluster = cluster
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                s = self.cluster.state
            except AssertionError:
                return
            live = [c for c in s.children if c.state in ("starting", "ready")]
            self.samples.append(
                (time.monotonic() - t0, sum(c.role == "prefill" for c in live), sum(c.role == "decode" for c in live))
            )

    def __enter__(self) -> InstanceSeconds:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    @property
    def total(self) -> float:
        return float(sum(p + d for _, p, d in self.samples))


_RUNS = iter(range(1, 1 << 30))


def run_ramp(cluster: MockCluster, ramp: Sequence[Phase], seed: int) -> RampResults:
    """The same arrivals every run (seed), new prompt token ids each run: a run never finds the prompts of the
    runs before it in the instances' prefix caches."""
    return asyncio.run(poisson_load(cluster.url, ramp, seed=seed, prompt_seed=seed * 1000 + next(_RUNS)))


def set_split(cluster: MockCluster, prefill: int, decode: int) -> None:
    sc = cluster.cli("scale", f"prefill={prefill}", f"decode={decode}", timeout=300)
    if sc.returncode != 0:
        raise RuntimeError(f"pdrelay scale prefill={prefill} decode={decode}: {sc.stdout}{sc.stderr}")
    time.sleep(3.0)  # drained instances finish leaving; load reports of the new ones arrive


def start_planner(cluster: MockCluster, flags: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    s = cluster.state
    cmd = [
        sys.executable,
        "-m",
        "services.planner",
        "--etcd-endpoints",
        s.etcd_url,
        "--nats-url",
        s.nats_url,
        "--cluster",
        s.cluster,
        "--instance-id",
        "planner-bench",
        "--lease-ttl-s",
        "2",
        *flags,
    ]
    if s.admin_secret_file:  # the supervisor obeys only signed scale commands
        cmd += ["--admin-secret-file", s.admin_secret_file]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline
        and b'"role": "planner"' not in log.read_bytes()
        and b'"role":"planner"' not in log.read_bytes()
    ):
        if proc.poll() is not None:
            raise RuntimeError(f"the planner exited: {log.read_text()[-2000:]}")
        time.sleep(0.3)
    return proc


def planner_decisions(cluster: MockCluster) -> list[Decision]:
    out = cluster.cli("planner", "log", "--json", "--last", "2000")
    return [json.loads(line) for line in out.stdout.splitlines()[1:]] if out.returncode == 0 else []


def reaction_intervals(
    results: RampResults,
    decisions: Sequence[Decision],
    t0_unix: float,
    interval_s: float,
    ttft_ms: float,
    itl_ms: float,
) -> dict[str, float | None]:
    """Per role, worst case, in evaluation intervals: from the moment a request was observably late to the
    planner's response. Observably late: prefill, arrival + the TTFT target (no first token by then); decode,
    first token + two ITL targets (its first gaps were slow). Response (`<role>`): the planner is acting on a
    breach of the role: a scale-up, or a decision that names the breach and why it adds nothing now (cooldown,
    budget, maximum, retry), which lasts until its next decision that names none (a repeated verdict is logged
    once); a request late while it acts counts 0. `<role>_scale_up`: to the next scale-up of the role."""
    out: dict[str, float | None] = {}
    for role in ("prefill", "decode"):
        late = sorted(
            (at + ttft_ms / 1e3) if role == "prefill" else (at + r.ttft_s + 2 * itl_ms / 1e3)
            for at, r in results
            if r.success and (r.ttft_s * 1e3 > ttft_ms if role == "prefill" else r.tpot_s * 1e3 > itl_ms)
        )
        mine = sorted((d for d in decisions if d["role"] == role), key=lambda d: d["ts"])
        acting = _acting(decisions, role, t0_unix)
        ups = [t for t, _ in acting if t in {d["ts"] - t0_unix for d in mine if d["action"] == "scale_up"}]
        out[role] = _worst_response(late, acting, interval_s)
        worst_up = None
        for i, u in enumerate(ups):
            prev = ups[i - 1] if i else float("-inf")
            first = next((x for x in late if prev < x <= u), None)
            if first is not None:
                worst_up = max(worst_up or 0.0, (u - first) / interval_s)
        out[f"{role}_scale_up"] = worst_up
    return out


def _acting(decisions: Sequence[Decision], role: str, t0_unix: float) -> list[tuple[float, bool]]:
    """(seconds into the run, whether the planner is acting on a breach of `role` from then on) per decision."""
    mine = sorted((d for d in decisions if d["role"] == role), key=lambda d: d["ts"])
    return [
        (
            d["ts"] - t0_unix,
            d["action"] == "scale_up" or (d["action"] == "hold" and any(w in d["reason"] for w in ACTING_WORDS)),
        )
        for d in mine
    ]


ACTING_WORDS = ("> target", "wait for admission", "busy", "KV pages")


def _worst_response(late: Sequence[float], acting: list[tuple[float, bool]], interval_s: float) -> float | None:
    """The longest wait, in intervals, from a moment of `late` to the planner acting (0 if it already was);
    None when nothing was late (or the run ended before any response)."""
    worst: float | None = None
    for t in late:
        if next((a for ts, a in reversed(acting) if ts <= t), False):
            r = 0.0
        else:
            nxt = next((ts for ts, a in acting if ts > t and a), None)
            if nxt is None:
                continue  # the run ended first
            r = (nxt - t) / interval_s
        worst = r if worst is None else max(worst, r)
    return worst


def window_reaction_intervals(
    results: RampResults,
    decisions: Sequence[Decision],
    t0_unix: float,
    interval_s: float,
    ttft_ms: float,
    itl_ms: float,
) -> dict[str, float | None]:
    """Per role, worst case, in evaluation intervals, from the moment an interval's clients were late on average
    to the planner acting on it (the aggregate an SLA planner such as Dynamo's acts on, where
    `reaction_intervals` takes every request alone). An interval is late when the mean TTFT of the requests that
    arrived in it (prefill), or the mean TPOT of those whose first token came in it (decode), breaks the target;
    it is observable at its end plus the target (prefill) or two ITL targets (decode)."""
    out: dict[str, float | None] = {}
    for role in ("prefill", "decode"):
        target = (ttft_ms if role == "prefill" else itl_ms) / 1e3
        windows: dict[int, list[float]] = {}
        for at, r in results:
            if r.success:
                key = int((at if role == "prefill" else at + r.ttft_s) // interval_s)
                windows.setdefault(key, []).append(r.ttft_s if role == "prefill" else r.tpot_s)
        seen = [
            (k + 1) * interval_s + (target if role == "prefill" else 2 * target)
            for k in sorted(windows)
            if sum(windows[k]) / len(windows[k]) > target
        ]
        out[role] = _worst_response(seen, _acting(decisions, role, t0_unix), interval_s)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.planner_ramp", description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=int, default=6, help="instances (prefill + decode) of every fixed split")
    p.add_argument("--splits", default="1,2,3,4,5", help="prefill counts of the fixed splits swept")
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="--mock-speedup of the engines (time compression: rates x S, targets / S)",
    )
    p.add_argument("--ttft-ms", type=float, default=3000.0, help="TTFT target at --speedup 1")
    p.add_argument("--itl-ms", type=float, default=80.0, help="ITL (TPOT) target at --speedup 1")
    p.add_argument(
        "--max-running",
        type=int,
        default=128,
        help="--max-running-requests of the engines (decode admits up to this many streams)",
    )
    p.add_argument("--interval-s", type=float, default=2.0, help="the planner's --evaluation-interval-s")
    p.add_argument("--max-scale-step", type=int, default=4, help="the planner's --max-scale-step")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--ramp", choices=sorted(RAMPS), default="minutes", help="the load ramp (see RAMPS)")
    p.add_argument("--quick", action="store_true", help="a 20 s ramp and one split (checks the harness)")
    p.add_argument("--planner-only", action="store_true", help="only the planner's run (no fixed splits, no ratios)")
    p.add_argument("--run-dir", default="/tmp/pdrelay-planner-ramp")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument(
        "--smoke-real",
        action="store_true",
        help="the scaled-down ramp with the planner on real engines (bundled model), then on mock ones",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.smoke_real:
        return smoke(ns)
    ns.ttft_ms, ns.itl_ms = ns.ttft_ms / ns.speedup, ns.itl_ms / ns.speedup
    ramp = compressed(RAMPS[ns.ramp], ns.speedup)
    ramp = ramp if not ns.quick else tuple(Phase(5, p.rate, p.isl, p.osl, p.rate_end) for p in ramp)
    splits = [int(x) for x in ns.splits.split(",")] if not ns.quick else [ns.budget // 2]
    run_dir = Path(ns.run_dir)
    pdrelay("down", "--run-dir", str(run_dir))
    engine_flags = ("--mock-speedup", str(ns.speedup), "--max-running-requests", str(ns.max_running))
    cluster = MockCluster(run_dir, "--prefill", "1", "--decode", "1", *engine_flags)
    report: dict[str, Any] = {
        "budget": ns.budget,
        "ramp_name": ns.ramp,
        "speedup": ns.speedup,
        "ttft_ms": ns.ttft_ms,
        "itl_ms": ns.itl_ms,
        "ramp": [[ph.seconds, ph.rate, ph.rate_end, ph.isl, ph.osl] for ph in ramp],
        "runs": {},
    }
    runs: dict[str, dict[str, Any]] = report["runs"]
    try:
        if not ns.planner_only:
            runs.update(fixed_runs(cluster, ramp, splits, ns))
        set_split(cluster, 1, 1)
        budget = str(ns.budget)
        flags = planner_flags(
            ns, budget, str(ns.budget - 1), str(ns.budget - 1), "--max-scale-step", str(ns.max_scale_step)
        )
        runs["planner"] = run_planner(cluster, ramp, ns.seed, flags, ns.interval_s, ns.ttft_ms, ns.itl_ms)
        if ns.planner_only:
            if ns.out:
                Path(ns.out).write_text(json.dumps(report, indent=1))
            print({k: v for k, v in runs["planner"].items() if k not in ("decisions", "sizes", "all_decisions")})
            print_decisions(runs["planner"]["decisions"], 200)
            return 0
        report["summary"] = summary(runs)
        print(json.dumps(report["summary"], indent=1))
        print_decisions(runs["planner"]["decisions"], 150)
        print("reaction (evaluation intervals), per request:", runs["planner"]["reaction_intervals"])
        print("reaction (evaluation intervals), per interval:", runs["planner"]["window_reaction_intervals"])
    finally:
        cluster.down()
    if ns.out:
        Path(ns.out).write_text(json.dumps(report, indent=1))
    return 0


def planner_flags(
    ns: argparse.Namespace, budget: str, max_prefill: str, max_decode: str, *extra: str
) -> tuple[str, ...]:
    """The planner's command line: the run's targets and interval (cooldowns of 2 and 4 intervals), its bounds."""
    return (
        "--ttft-target-ms",
        str(ns.ttft_ms),
        "--itl-target-ms",
        str(ns.itl_ms),
        "--budget",
        budget,
        "--max-prefill",
        max_prefill,
        "--max-decode",
        max_decode,
        "--evaluation-interval-s",
        str(ns.interval_s),
        "--scale-up-cooldown-s",
        str(2 * ns.interval_s),
        "--scale-down-cooldown-s",
        str(4 * ns.interval_s),
        *extra,
    )


def fixed_runs(
    cluster: MockCluster, ramp: Sequence[Phase], splits: Sequence[int], ns: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """The ramp on the fixed 1P1D and on each fixed split of the budget, printed as each ends."""
    runs: dict[str, dict[str, Any]] = {}
    configs = [("fixed 1P1D", 1, 1)] + [(f"fixed {s}P{ns.budget - s}D", s, ns.budget - s) for s in splits]
    for name, pf, dc in configs:
        set_split(cluster, pf, dc)
        with InstanceSeconds(cluster) as inst:
            res = run_ramp(cluster, ramp, ns.seed)
        runs[name] = {**goodput(res, ns.ttft_ms, ns.itl_ms), "instance_s": inst.total}
        print(name, runs[name], flush=True)
    return runs


def summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The planner's goodput against the fixed 1P1D and the best fixed split (by good requests)."""
    best = max((n for n in runs if n.startswith("fixed ") and n != "fixed 1P1D"), key=lambda n: runs[n]["good"])
    g = runs["planner"]["good"]
    share = {n: r["good"] / max(1, r["requests"]) for n, r in runs.items()}
    return {
        "best_fixed": best,
        "planner_vs_1p1d": g / max(1, runs["fixed 1P1D"]["good"]),
        "planner_vs_best_fixed": g / max(1, runs[best]["good"]),
        "good_share": share,  # good / offered: the same ratio, insensitive to how many arrivals a run got
        "planner_failed_requests": runs["planner"]["failed"],
        "instance_s_planner_vs_best": runs["planner"]["instance_s"] / max(1.0, runs[best]["instance_s"]),
    }


def print_decisions(decisions: Sequence[dict[str, Any]], width: int) -> None:
    for d in decisions:
        print(
            f"  t={d['t']:6.1f}s {d['role']:8} {d['action']:10} {d['current']}->{d['target']}  {d['reason'][:width]}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
