"""Serving overhead: pdrelay served colocated (gateway + one worker, HTTP, the bench client) vs the same engine in
this process, same workload, interleaved round by round so a shared box's drift hits both alike.

    python -m bench.serve.overhead --random-input-len 128 --random-output-len 64 --num-prompts 64 \\
        --max-concurrency 16 --repeat 3

Starts `pdrelay up --worker 1 --prefill 0 --decode 0` with its defaults (no --threads), then per round: the
workload through an engine built here from the worker's resolved config (every core, the cluster idle meanwhile),
then the same workload over HTTP. Prints each round's output tok/s and served / in-process ratio, and the median
ratio (target >= 0.9x). The served worker's engine profile (busy share, steps, tokens per step) is printed per
round from its /metrics counters: busy ~100% means the engine limits the served run, not the serving path.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TARGET = 0.9


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bench.serve.main import add_arguments as serve_arguments

    serve_arguments(p)
    p.add_argument("--repeat", type=int, default=3, help="rounds (each: in-process, then served)")
    p.add_argument("--worker-flags", default="", help="extra flags of the served worker, e.g. '--threads 2'")


def run(ns: argparse.Namespace) -> int:
    from bench.engine import Workload as EngineWorkload
    from bench.engine import run_engine
    from bench.serve.compare import _log, _measure_all, _NullMeter
    from bench.serve.datasets import BenchTokenizer, random_dataset
    from bench.serve.main import DEFAULT_MODEL
    from shared.cluster.handshake import read_ready_file
    from shared.cluster.localcluster import detached
    from shared.cluster.localcluster.plan import UpOptions
    from shared.cluster.localcluster.servers import free_port
    from shared.config import PassContext, resolve
    from shared.engine.engine import Engine
    from shared.modelspec.bundled import resolve_model_path

    if ns.repeat < 1:
        print(f"bench serve overhead: --repeat {ns.repeat} must be >= 1", file=sys.stderr)
        return 2
    model_dir = resolve_model_path(ns.model or DEFAULT_MODEL)
    ns.model = None  # the served name comes from GET /v1/models
    tok = BenchTokenizer.from_dir(Path(model_dir))

    def workload(seed: int) -> tuple[list[Any], tuple[tuple[tuple[int, ...], int], ...]]:
        """The seeded requests (for HTTP) and the same prompts as ids (for the in-process engine)."""
        reqs = random_dataset(
            tok,
            num_prompts=ns.num_prompts,
            input_len=ns.random_input_len,
            output_len=ns.random_output_len,
            seed=seed,
            range_ratio=ns.random_range_ratio,
            token_ids=ns.random_prompt_format == "ids",
        )
        ids = tuple(
            (tuple(tok.encode(r.prompt)) if isinstance(r.prompt, str) else tuple(r.prompt), r.output_len) for r in reqs
        )
        return reqs, ids

    name = f"random {ns.random_input_len}/{ns.random_output_len} range {ns.random_range_ratio:g}"
    _, warm_ids = workload(ns.seed + 1000)
    conc = ns.max_concurrency or ns.num_prompts
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pdrelay-bench-overhead-") as tmp:
        run_dir = Path(tmp) / "colocated"
        counts = {"gateway": 1, "worker": 1}
        role_extra = {"worker": tuple(ns.worker_flags.split())} if ns.worker_flags else {}
        opts = UpOptions(
            run_dir=str(run_dir),
            cluster="bench-overhead",
            etcd_port=free_port(),
            nats_port=free_port(),
            counts=counts,
            extra=("--model", str(model_dir), "--port", str(free_port())),
            role_extra=role_extra,
            ready_timeout_s=600.0,
            echo_log=False,
        )
        state = detached.start(opts)
        try:
            gateway = next(c for c in state.children if c.role == "gateway")
            workers = tuple(c.pid for c in state.children if c.role != "gateway")
            engines = {}
            for c in state.children:
                if c.role != "gateway":
                    info = read_ready_file(run_dir / "ready" / f"{c.instance_id}.json")
                    if info is not None and info.metrics:
                        engines[c.instance_id] = info.metrics
            cfg = resolve("worker", ["--model", str(model_dir)], env={}, ctx=PassContext(exclusive_host=True))
            engine = Engine.from_config(cfg)
            try:
                warm = EngineWorkload("warm", conc, warm_ids[: max(1, ns.num_warmups)])
                run_engine(engine, _NullMeter(), warm, "warm")
                for r in range(ns.repeat):
                    # new prompts every round: a repeated one would be served from both engines' prefix caches
                    reqs, ids = workload(ns.seed + r)
                    res = run_engine(engine, _NullMeter(), EngineWorkload(name, conc, ids), f"r{r}")
                    served = _measure_all(
                        "pdrelay-colocated",
                        f"http://{gateway.http}",
                        gateway.pid,
                        workers,
                        [(name, reqs)],
                        ns,
                        tok,
                        None,
                        (99.0,),
                        time.monotonic() + 1800.0,
                        engines=engines,
                    )[name]
                    row = {
                        "round": r + 1,
                        "in_process_tok_s": res["output_tok_s"],
                        "in_process_step_ms": res["step_ms_mean"],
                        "in_process_steps": res["steps"],
                        "served_tok_s": served["output_throughput"],
                        "served_mean_ttft_ms": served["mean_ttft_ms"],
                        "served_mean_tpot_ms": served["mean_tpot_ms"],
                        "ratio": served["output_throughput"] / res["output_tok_s"],
                        "engines": served.get("engines", {}),
                    }
                    rounds.append(row)
                    _log(
                        f"round {r + 1}: in-process {row['in_process_tok_s']:.1f} tok/s ({res['steps']} steps of "
                        f"{res['step_ms_mean']:.0f} ms), served {row['served_tok_s']:.1f} tok/s -> "
                        f"{row['ratio']:.2f}x"
                    )
            finally:
                del engine
                gc.collect()
        finally:
            detached.stop(run_dir, timeout_s=30.0, say=lambda m: _log(f"pdrelay colocated: {m}"))
    med = statistics.median(r["ratio"] for r in rounds)
    print(
        f"serving overhead, {name}, {ns.num_prompts} prompts at concurrency {conc}, {len(rounds)} interleaved "
        f"rounds (in-process engine with the worker's config, then served colocated):"
    )
    for r in rounds:
        prof = next(iter(r["engines"].values()), {})
        extra = (
            f"  worker busy {prof['engine_busy_share']:.0%}, {prof['engine_steps']:.0f} steps of "
            f"{prof['engine_step_ms']:.0f} ms ({prof['engine_tokens_per_step']:.0f} tok/step)"
            if prof
            else ""
        )
        print(
            f"  round {r['round']}: in-process {r['in_process_tok_s']:6.1f} tok/s ({r['in_process_steps']} steps "
            f"of {r['in_process_step_ms']:.0f} ms)  served {r['served_tok_s']:6.1f} tok/s  "
            f"{r['ratio']:.2f}x{extra}"
        )
    print(f"median served / in-process: {med:.2f}x (target >= {TARGET}x) {'met' if med >= TARGET else 'NOT met'}")
    if ns.output_json:
        Path(ns.output_json).write_text(json.dumps({"workload": name, "rounds": rounds, "median_ratio": med}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve.overhead", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
