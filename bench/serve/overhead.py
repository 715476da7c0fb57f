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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.serve.datasets import BenchRequest, BenchTokenizer

TARGET = 0.9


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bench.serve.main import add_arguments as serve_arguments

    serve_arguments(p)
    p.add_argument("--repeat", type=int, default=3, help="rounds (each: in-process, then served)")
    p.add_argument("--worker-flags", default="", help="extra flags of the served worker, e.g. '--threads 2'")


def run(ns: argparse.Namespace) -> int:
    from bench.serve.compare import _log
    from bench.serve.datasets import BenchTokenizer
    from bench.serve.main import DEFAULT_MODEL
    from shared.cluster.localcluster import detached
    from shared.modelspec.bundled import resolve_model_path

    if ns.repeat < 1:
        print(f"bench serve overhead: --repeat {ns.repeat} must be >= 1", file=sys.stderr)
        return 2
    model_dir = resolve_model_path(ns.model or DEFAULT_MODEL)
    ns.model = None  # the served name comes from GET /v1/models
    tok = BenchTokenizer.from_dir(model_dir)
    name = f"random {ns.random_input_len}/{ns.random_output_len} range {ns.random_range_ratio:g}"
    conc = ns.max_concurrency or ns.num_prompts
    with tempfile.TemporaryDirectory(prefix="pdrelay-bench-overhead-") as tmp:
        run_dir = Path(tmp) / "colocated"
        served = _start_colocated(ns, model_dir, run_dir)
        try:
            rounds = _interleaved_rounds(ns, model_dir, tok, served, name, conc)
        finally:
            detached.stop(run_dir, timeout_s=30.0, say=lambda m: _log(f"pdrelay colocated: {m}"))
    med = statistics.median(r["ratio"] for r in rounds)
    print(
        f"serving overhead, {name}, {ns.num_prompts} prompts at concurrency {conc}, {len(rounds)} interleaved "
        f"rounds (in-process engine with the worker's config, then served colocated):"
    )
    for row in rounds:
        print(_round_line(row))
    print(f"median served / in-process: {med:.2f}x (target >= {TARGET}x) {'met' if med >= TARGET else 'NOT met'}")
    if ns.output_json:
        Path(ns.output_json).write_text(json.dumps({"workload": name, "rounds": rounds, "median_ratio": med}, indent=2))
    return 0


@dataclass(frozen=True)
class _Colocated:
    """The served side: `pdrelay up --worker 1` with its gateway, worker pids and engine metrics addresses."""

    gateway_url: str
    gateway_pid: int
    workers: tuple[int, ...]
    engines: dict[str, str]  # instance id -> metrics address


def _start_colocated(ns: argparse.Namespace, model_dir: Path, run_dir: Path) -> _Colocated:
    from shared.cluster.handshake import read_ready_file
    from shared.cluster.localcluster import detached
    from shared.cluster.localcluster.plan import UpOptions
    from shared.cluster.localcluster.servers import free_port

    role_extra = {"worker": tuple(ns.worker_flags.split())} if ns.worker_flags else {}
    opts = UpOptions(
        run_dir=str(run_dir),
        cluster="bench-overhead",
        etcd_port=free_port(),
        nats_port=free_port(),
        counts={"gateway": 1, "worker": 1},
        extra=("--model", str(model_dir), "--port", str(free_port())),
        role_extra=role_extra,
        ready_timeout_s=600.0,
        echo_log=False,
    )
    state = detached.start(opts)
    gateway = next(c for c in state.children if c.role == "gateway")
    engines = {}
    for c in state.children:
        if c.role != "gateway":
            info = read_ready_file(run_dir / "ready" / f"{c.instance_id}.json")
            if info is not None and info.metrics:
                engines[c.instance_id] = info.metrics
    workers = tuple(c.pid for c in state.children if c.role != "gateway")
    return _Colocated(f"http://{gateway.http}", gateway.pid, workers, engines)


def _workload(
    ns: argparse.Namespace, tok: BenchTokenizer, seed: int
) -> tuple[list[BenchRequest], tuple[tuple[tuple[int, ...], int], ...]]:
    """The seeded requests (for HTTP) and the same prompts as ids (for the in-process engine)."""
    from bench.serve.datasets import random_dataset

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


def _interleaved_rounds(
    ns: argparse.Namespace, model_dir: Path, tok: BenchTokenizer, served: _Colocated, name: str, conc: int
) -> list[dict[str, Any]]:
    """--repeat rounds, each the workload on an engine built here from the worker's resolved config (every core,
    the cluster idle meanwhile), then over HTTP; new prompts every round: a repeated one would be served from both
    engines' prefix caches."""
    from bench.engine import Workload as EngineWorkload
    from bench.engine import run_engine
    from bench.serve.compare import _NullMeter
    from shared.config import PassContext, resolve
    from shared.engine.engine import Engine

    _, warm_ids = _workload(ns, tok, ns.seed + 1000)
    cfg = resolve("worker", ["--model", str(model_dir)], env={}, ctx=PassContext(exclusive_host=True))
    engine = Engine.from_config(cfg)
    try:
        warm = EngineWorkload("warm", conc, warm_ids[: max(1, ns.num_warmups)])
        run_engine(engine, _NullMeter(), warm, "warm")
        rounds: list[dict[str, Any]] = []
        for r in range(ns.repeat):
            reqs, ids = _workload(ns, tok, ns.seed + r)
            res = run_engine(engine, _NullMeter(), EngineWorkload(name, conc, ids), f"r{r}")
            rounds.append(_round(ns, tok, served, name, reqs, res, r + 1))
        return rounds
    finally:
        del engine
        gc.collect()


def _round(
    ns: argparse.Namespace,
    tok: BenchTokenizer,
    served: _Colocated,
    name: str,
    reqs: list[BenchRequest],
    res: dict[str, Any],
    number: int,
) -> dict[str, Any]:
    """The served half of a round (`res`: its in-process half) and the round's row, logged."""
    from bench.serve.compare import _log, _measure_all

    got = _measure_all(
        "pdrelay-colocated",
        served.gateway_url,
        served.gateway_pid,
        served.workers,
        [(name, reqs)],
        ns,
        tok,
        None,
        (99.0,),
        time.monotonic() + 1800.0,
        engines=served.engines,
    )[name]
    row = {
        "round": number,
        "in_process_tok_s": res["output_tok_s"],
        "in_process_step_ms": res["step_ms_mean"],
        "in_process_steps": res["steps"],
        "served_tok_s": got["output_throughput"],
        "served_mean_ttft_ms": got["mean_ttft_ms"],
        "served_mean_tpot_ms": got["mean_tpot_ms"],
        "ratio": got["output_throughput"] / res["output_tok_s"],
        "engines": got.get("engines", {}),
    }
    _log(
        f"round {number}: in-process {row['in_process_tok_s']:.1f} tok/s ({res['steps']} steps of "
        f"{res['step_ms_mean']:.0f} ms), served {row['served_tok_s']:.1f} tok/s -> "
        f"{row['ratio']:.2f}x"
    )
    return row


def _round_line(row: dict[str, Any]) -> str:
    """A round in the final table, with the served worker's engine profile when its /metrics answered."""
    prof: dict[str, float] = next(iter(row["engines"].values()), {})
    extra = (
        f"  worker busy {prof['engine_busy_share']:.0%}, {prof['engine_steps']:.0f} steps of "
        f"{prof['engine_step_ms']:.0f} ms ({prof['engine_tokens_per_step']:.0f} tok/step)"
        if prof
        else ""
    )
    return (
        f"  round {row['round']}: in-process {row['in_process_tok_s']:6.1f} tok/s ({row['in_process_steps']} steps "
        f"of {row['in_process_step_ms']:.0f} ms)  served {row['served_tok_s']:6.1f} tok/s  "
        f"{row['ratio']:.2f}x{extra}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve.overhead", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
