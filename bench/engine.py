"""Engine benchmark: output tok/s of the pdrelay engine vs HF `generate` in static batches, in the same run.

    python -m bench.engine [--threads 2] [--quick] [--json-out PATH] [--url http://host:port]
    pdrelay bench engine ...   (same flags)

Workloads (greedy, ignore_eos, random prompt ids from a seed):
  uniform  128 prompt / 64 output tokens at concurrency 1, 8, 16, 32 (2 x concurrency requests, closed loop)
  varied   64 requests, prompts 32-512 and outputs 16-256 tokens, concurrency 16
The engine keeps `concurrency` requests in flight (a finished request is replaced at once); HF runs the same
requests in static batches of `concurrency` (left padding, each batch runs to its longest request) and is
credited only with the tokens requested. Printed per workload: tok/s of both and their ratio, step latency,
the scheduler + batching share of step time, and the roofline: each step's FLOPs over a matmul rate and its
bytes (weights + KV read) over a copy bandwidth, both measured in this run, summed over the steps actually run.
`--url` sends the same workloads to an OpenAI-compatible server (/v1/completions, prompt as token ids or text)
for a side-by-side ratio (e.g. vLLM).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.engine_roofline import Meter, MeteredRunner, measure_machine, roofline
from bench.entry import bench_main
from bench.urls import openai_base_url

TARGETS = {"uniform_c16_vs_hf": 1.5, "varied_vs_hf": 2.5, "overhead_c16_max": 0.10}


@dataclass(frozen=True)
class Workload:
    name: str
    concurrency: int
    requests: tuple[tuple[tuple[int, ...], int], ...]  # (prompt ids, output tokens)

    @property
    def output_tokens(self) -> int:
        return sum(n for _, n in self.requests)


def fresh_prompts(w: Workload, k: int, vocab: int) -> Workload:
    """`w` whose prompts miss the prefix cache of runs 0..k-1: run k shifts each prompt's first token by k (the
    radix cache matches from the first token on, so a repeated prompt would be served from the cache)."""
    if k == 0:
        return w
    lo = min(100, vocab // 4)
    shift = tuple((((p[0] - lo + k) % (vocab - lo)) + lo, *p[1:]) if p else p for p, _ in w.requests)
    return Workload(w.name, w.concurrency, tuple((q, n) for q, (_, n) in zip(shift, w.requests, strict=True)))


def make_workloads(vocab: int, *, quick: bool, seed: int, concurrency: Sequence[int] | None) -> list[Workload]:
    rng = random.Random(seed)
    lo = min(100, vocab // 4)  # skip the low ids, where tokenizers keep their special tokens

    def prompt(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(lo, vocab) for _ in range(n))

    if quick:
        isl, osl, concs, n_var, p_rng, o_rng, c_var = 32, 8, concurrency or (1, 4), 8, (16, 64), (4, 16), 4
    else:
        isl, osl, concs, n_var, p_rng, o_rng, c_var = (
            128,
            64,
            concurrency or (1, 8, 16, 32),
            64,
            (32, 512),
            (16, 256),
            16,
        )
    out = [Workload(f"uniform-{isl}/{osl}", c, tuple((prompt(isl), osl) for _ in range(max(2 * c, 2)))) for c in concs]
    varied = tuple((prompt(rng.randint(*p_rng)), rng.randint(*o_rng)) for _ in range(n_var))
    out.append(Workload("varied", c_var, varied))
    return out


# ---- the three ways of running a workload ---------------------------------------------------------------------------
def run_engine(engine: Any, meter: Meter, w: Workload, tag: str) -> dict[str, Any]:
    from shared.modelspec.sampling import SamplingParams

    engine.reset_stats()
    meter.flops.clear()
    meter.bytes.clear()
    pending = deque(enumerate(w.requests))
    inflight = done = produced = 0
    steps: list[float] = []
    t0 = time.perf_counter()
    while done < len(w.requests):
        while inflight < w.concurrency and pending:
            i, (p, n) = pending.popleft()
            engine.add_request(f"{tag}-{i}", p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
            inflight += 1
        ts = time.perf_counter()
        outs = engine.step()
        steps.append(time.perf_counter() - ts)
        for o in outs:
            produced += len(o.new_token_ids)
            if o.finished:
                done += 1
                inflight -= 1
    elapsed = time.perf_counter() - t0
    assert produced == w.output_tokens, f"engine produced {produced} tokens, {w.output_tokens} requested"
    tot = engine.stats.totals
    step_sum = sum(steps)
    return {
        "output_tok_s": produced / elapsed,
        "elapsed_s": elapsed,
        "steps": len(steps),
        "step_ms_mean": 1e3 * step_sum / len(steps),
        "step_ms_p50": 1e3 * statistics.median(steps),
        "step_ms_p99": 1e3 * sorted(steps)[min(len(steps) - 1, int(0.99 * len(steps)))],
        "overhead_share": (tot.schedule_s + tot.prepare_s + tot.update_s) / step_sum,
        "schedule_share": tot.schedule_s / step_sum,
        "batching_share": tot.prepare_s / step_sum,
        "update_share": tot.update_s / step_sum,
        "sample_share": tot.sample_s / step_sum,
        "forward_share": tot.forward_s / step_sum,
        "preemptions": engine.stats.num_preemptions,
        "flops": sum(meter.flops),
        "bytes": sum(meter.bytes),
        "_meter": (list(meter.flops), list(meter.bytes)),
    }


def run_hf(hf: Any, w: Workload) -> dict[str, Any]:
    """Static batches of `concurrency` requests: left padding, each batch runs to its longest request."""
    import torch

    t0 = time.perf_counter()
    for b in range(0, len(w.requests), w.concurrency):
        batch = w.requests[b : b + w.concurrency]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for i, (p, _) in enumerate(batch):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        n = max(o for _, o in batch)
        with torch.inference_mode():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0)
    elapsed = time.perf_counter() - t0
    return {"output_tok_s": w.output_tokens / elapsed, "elapsed_s": elapsed}


def run_server(url: str, model: str, w: Workload, tokenizer: Any | None) -> dict[str, Any]:
    """The workload against an OpenAI-compatible /v1/completions (token ids, or text when a tokenizer is given)."""
    import asyncio

    import httpx

    async def main() -> tuple[int, float]:
        sem = asyncio.Semaphore(w.concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=3600) as client:

            async def one(p: tuple[int, ...], n: int) -> int:
                prompt: Any = tokenizer.decode(list(p)) if tokenizer is not None else list(p)
                body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0.0, "ignore_eos": True}
                async with sem:
                    r = await client.post("/v1/completions", json=body)
                r.raise_for_status()
                return int(r.json()["usage"]["completion_tokens"])

            t0 = time.perf_counter()
            counts = await asyncio.gather(*(one(p, n) for p, n in w.requests))
            return sum(counts), time.perf_counter() - t0

    try:
        produced, elapsed = asyncio.run(main())
    except httpx.HTTPStatusError as e:
        raise ValueError(
            f"--url {url}: POST /v1/completions answered {e.response.status_code}: {e.response.text[:200]}"
        ) from None
    except httpx.HTTPError as e:
        raise ValueError(f"--url {url}: the server stopped answering ({type(e).__name__}: {e})") from None
    return {"output_tok_s": produced / elapsed, "elapsed_s": elapsed, "output_tokens": produced}


# ---- driver -------------------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bundled:smollm2-135m-instruct", help="bundled:<name> or a local HF model dir")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    p.add_argument("--quick", action="store_true", help="a small version for smoke tests")
    p.add_argument("--concurrency", default=None, help="uniform workload concurrencies (default 1,8,16,32)")
    p.add_argument("--workloads", default="uniform,varied", help="comma-separated: uniform, varied")
    p.add_argument("--no-hf", dest="hf", action="store_false", help="skip the HF generate baseline")
    p.add_argument("--url", default=None, help="also drive an OpenAI-compatible server at this base URL")
    p.add_argument("--url-model", default=None, help="model name for --url (default: the server's first model)")
    p.add_argument("--url-text", action="store_true", help="send prompts to --url as text, not token ids")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="weights and activations of BOTH the engine and the HF baseline (bfloat16: the same "
        "comparison where the CPU has bf16 matmuls; the roofline's matmul rate stays fp32)",
    )
    p.add_argument(
        "--attention-backend",
        default="auto",
        choices=("auto", "torch", "native"),
        help="the engine's attention kernels on CPU (auto: native where it builds)",
    )
    p.add_argument(
        "--linear-backend",
        default="auto",
        choices=("auto", "torch", "onednn"),
        help="the engine's dense projections (auto: prepacked oneDNN for float32 on CPU); HF always "
        "runs torch's F.linear",
    )
    p.add_argument(
        "--quantization",
        default=None,
        choices=("fp8",),
        help="the engine's projections as fp8 blocks, dequantized per call (an unquantized checkpoint is quantized "
        "at load); HF runs the unquantized weights",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default=None,
        choices=("float32", "bfloat16", "fp8_e4m3"),
        help="the engine's KV pages (default: --dtype); another dtype runs the torch attention ops",
    )
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-budget-mb", type=int, default=1024, help="KV pool size in MiB")
    p.add_argument("--chunked-prefill-size", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="runs per workload and side, alternating; best one counts")
    p.add_argument("--json-out", default=None, metavar="PATH", help="also write the results as JSON to PATH")


def run(ns: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from shared.modelspec.bundled import resolve_model_path

    threads = ns.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    try:
        concs, wanted = _workload_flags(ns)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    server_model = None
    if ns.url:  # before loading anything: a bad or unreachable URL fails in a second, with one line
        try:
            ns.url = openai_base_url("--url", ns.url)
            server_model = ns.url_model or _first_model(ns.url)
        except ValueError as e:
            print(f"pdrelay bench engine: {e}", file=sys.stderr)
            return 2
    model_dir = resolve_model_path(ns.model)
    vocab = _vocab_size(model_dir)
    workloads = [
        w
        for w in make_workloads(vocab, quick=ns.quick, seed=ns.seed, concurrency=concs)
        if w.name.split("-")[0] in wanted
    ]
    sides = _load_sides(ns, model_dir, threads, max(w.concurrency for w in workloads), server_model)
    _warm_up(sides, workloads[0])
    machine, runner = sides.machine, sides.runner
    print(
        f"model {ns.model}  {ns.dtype}  attention {runner.attn.name}  linear {runner.linear.name}  threads {threads}  matmul {machine['matmul_gflops']:.0f} GFLOPS  "
        f"copy {machine['copy_gbps']:.1f} GB/s  weights {runner.model.weight_bytes / 1e6:.0f} MB",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    for i, w in enumerate(workloads):
        try:
            res = _measure_workload(ns, sides, w, f"w{i}", vocab)
        except ValueError as e:  # the server stopped answering
            print(f"pdrelay bench engine: {e}", file=sys.stderr)
            return 1
        results.append(res)
        print(_row(res), flush=True)
    summary = {
        "model": ns.model,
        "dtype": ns.dtype,
        "attention_backend": runner.attn.name,
        "linear_backend": runner.linear.name,
        "quick": ns.quick,
        "repeat": ns.repeat,
        "machine": machine,
        "results": results,
        "targets": _targets(results, ns.quick),
    }
    for line in _target_lines(summary["targets"]):
        print(line)
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


def _workload_flags(ns: argparse.Namespace) -> tuple[tuple[int, ...] | None, set[str]]:
    """(--concurrency values or None for the defaults, the --workloads kinds); ValueError naming a bad flag."""
    concs = tuple(int(c) for c in ns.concurrency.split(",")) if ns.concurrency else None
    if concs is not None and any(c < 1 for c in concs):
        raise ValueError(f"--concurrency {ns.concurrency}: every value must be >= 1")
    if ns.repeat < 1:
        raise ValueError(f"--repeat {ns.repeat} must be >= 1")
    wanted = {x.strip() for x in ns.workloads.split(",") if x.strip()}
    if not wanted <= {"uniform", "varied"}:
        raise ValueError(f"--workloads {ns.workloads}: choose from uniform, varied")
    return concs, wanted


@dataclass(frozen=True)
class _Sides:
    """What a workload runs on: the metered engine, and optionally the HF baseline and an OpenAI server."""

    runner: Any  # ModelRunner
    metered: MeteredRunner
    engine: Any  # Engine over `metered`
    machine: dict[str, float]  # the roofline's rates (measure_machine) and the torch threads
    hf: Any | None  # transformers model, None with --no-hf
    server_model: str | None  # --url's model, None without --url
    server_tok: Any | None  # tokenizer for --url-text


def _load_sides(
    ns: argparse.Namespace, model_dir: Any, threads: int, max_conc: int, server_model: str | None
) -> _Sides:
    """The engine (sized for the largest concurrency), the machine's rates, then the HF model and tokenizer."""
    import torch

    from shared.config.groups import CacheConfig, SchedulerConfig
    from shared.engine.engine import Engine
    from shared.engine.model_runner import ModelRunner

    runner = ModelRunner(
        model_dir,
        dtype=ns.dtype,
        kv_cache_dtype=ns.kv_cache_dtype,
        quantization=ns.quantization,
        page_size=ns.page_size,
        kv_budget_bytes=ns.kv_budget_mb << 20,
        attention_backend=ns.attention_backend,
        linear_backend=ns.linear_backend,
        max_batch_tokens=max(ns.chunked_prefill_size, max_conc),
    )
    metered = MeteredRunner(runner)
    engine = Engine(
        metered,
        cache=CacheConfig(page_size=ns.page_size),
        scheduler=SchedulerConfig(
            max_running_requests=max_conc,
            chunked_prefill_size=ns.chunked_prefill_size,
            max_prefill_tokens=ns.chunked_prefill_size,
            max_queued_requests=1 << 20,
        ),
        threads=threads,
    )
    a = runner.arch
    machine = measure_machine(a.hidden_size, a.intermediate_size, batch=256)
    machine["threads"] = threads
    hf = None
    if ns.hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, ns.dtype)).eval()
        hf.generation_config.eos_token_id = None  # ignore_eos, like the engine
    server_tok = None
    if ns.url and ns.url_text:
        from transformers import AutoTokenizer

        server_tok = AutoTokenizer.from_pretrained(model_dir)
    return _Sides(runner, metered, engine, machine, hf, server_model, server_tok)


def _warm_up(sides: _Sides, first: Workload) -> None:
    """First-call allocations and lazy initialisation stay out of the numbers."""
    first_prompt = first.requests[0][0]
    warm = Workload("warmup", 2, ((first_prompt[:16], 4), (first_prompt[-16:], 4)))
    run_engine(sides.engine, sides.metered.meter, warm, "warm")
    if sides.hf is not None:
        run_hf(sides.hf, warm)


def _measure_workload(ns: argparse.Namespace, sides: _Sides, w: Workload, tag: str, vocab: int) -> dict[str, Any]:
    """One workload on every side; ValueError when the --url server fails."""
    res: dict[str, Any] = {
        "workload": w.name,
        "concurrency": w.concurrency,
        "requests": len(w.requests),
        "output_tokens": w.output_tokens,
    }
    # Engine and HF alternate, best of --repeat each: load from other processes drifts, so both sides see it.
    eng: dict[str, Any] = {}
    base: dict[str, Any] = {}
    for k in range(ns.repeat):
        e = run_engine(sides.engine, sides.metered.meter, fresh_prompts(w, k, vocab), f"{tag}.{k}")
        e.update(roofline(e, sides.machine))
        eng = e if not eng or e["output_tok_s"] > eng["output_tok_s"] else eng
        if sides.hf is not None:
            h = run_hf(sides.hf, w)
            base = h if not base or h["output_tok_s"] > base["output_tok_s"] else base
    res["engine"] = eng
    if sides.hf is not None:
        res["hf"] = base
        res["ratio_vs_hf"] = eng["output_tok_s"] / base["output_tok_s"]
    if ns.url:
        res["server"] = run_server(ns.url, sides.server_model or "", w, sides.server_tok)
        res["ratio_vs_server"] = eng["output_tok_s"] / res["server"]["output_tok_s"]
    return res


def _vocab_size(model_dir: Any) -> int:
    """From config.json alone, before the weights load."""
    from shared.engine.models import load_model_config

    return load_model_config(model_dir).vocab_size


def _first_model(url: str) -> str:
    """The server's first model; ValueError naming --url when it is unreachable or lists none."""
    import httpx

    try:
        r = httpx.get(url + "/v1/models", timeout=30)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except httpx.HTTPStatusError as e:
        raise ValueError(
            f"--url {url}: GET /v1/models answered {e.response.status_code}; is it an OpenAI "
            "server (write its base URL, e.g. http://127.0.0.1:8000 or .../v1)?"
        ) from None
    except httpx.HTTPError as e:
        raise ValueError(
            f"--url {url}: cannot reach the server ({type(e).__name__}: {e}); start it or fix the URL"
        ) from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"--url {url}: GET /v1/models listed no model; pass --url-model NAME") from None


def _row(res: dict[str, Any]) -> str:
    e = res["engine"]
    parts = [
        f"{res['workload']:>16} c={res['concurrency']:<3} n={res['requests']:<3}",
        f"engine {e['output_tok_s']:7.1f} tok/s",
    ]
    if "hf" in res:
        parts.append(f"hf {res['hf']['output_tok_s']:7.1f} tok/s ({res['ratio_vs_hf']:.2f}x)")
    if "server" in res:
        parts.append(f"server {res['server']['output_tok_s']:7.1f} tok/s ({res['ratio_vs_server']:.2f}x)")
    parts.append(f"step {e['step_ms_mean']:.1f}/{e['step_ms_p50']:.1f}/{e['step_ms_p99']:.1f} ms mean/p50/p99")
    parts.append(f"sched+batch {100 * e['overhead_share']:.1f}% sample {100 * e['sample_share']:.1f}%")
    parts.append(
        f"roofline {100 * e['roofline_fraction']:.0f}% ({100 * e['compute_bound_steps']:.0f}% of steps compute-bound)"
    )
    return "  ".join(parts)


def _targets(results: list[dict[str, Any]], quick: bool) -> dict[str, Any]:
    """The project's targets, evaluated where this run has the numbers (not meaningful with --quick)."""
    out: dict[str, Any] = {}
    by = {(r["workload"].split("-")[0], r["concurrency"]): r for r in results}
    u16 = by.get(("uniform", 16))
    var = next((r for r in results if r["workload"] == "varied"), None)
    if u16 is not None and "ratio_vs_hf" in u16:
        out["uniform_c16_vs_hf"] = {"value": u16["ratio_vs_hf"], "target": TARGETS["uniform_c16_vs_hf"]}
    if var is not None and "ratio_vs_hf" in var:
        out["varied_vs_hf"] = {"value": var["ratio_vs_hf"], "target": TARGETS["varied_vs_hf"]}
    if u16 is not None:
        out["overhead_c16"] = {
            "value": u16["engine"]["overhead_share"],
            "target": TARGETS["overhead_c16_max"],
            "max": True,
        }
    for v in out.values():
        v["met"] = v["value"] <= v["target"] if v.get("max") else v["value"] >= v["target"]
    if quick:
        out = {k: {**v, "note": "--quick: not a measurement of the target"} for k, v in out.items()}
    return out


def _target_lines(targets: dict[str, Any]) -> list[str]:
    return [
        f"target {k}: {v['value']:.3f} ({'<=' if v.get('max') else '>='} {v['target']}) "
        f"{'met' if v['met'] else 'NOT met'}"
        for k, v in targets.items()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.engine", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
