"""Where an engine step's time goes: prefill steps and decode steps of the worker's engine, split by component
(dense projections, down projection, LM head, attention, elementwise ops, sampling, the scheduler), with each
GEMM group's GFLOPS and the attention's KV read rate, against this box's fp32 matmul rate.

    python -m bench.step_profile --requests 16 --input-len 128 --output-len 64

Builds the engine from the worker's resolved config (every core, as `bench serve --compare-peer` runs it in
process), runs one warm-up wave, then times one wave with a clock around each kernel call. What the components
leave of the step is the model's Python between calls and the calls' own overhead. Each clock reading costs
about a microsecond and a decode step makes ~270 clocked calls, so timed steps run a little slower than untimed ones.
That cost is an estimate and was not measured on its own. The clocks replace the model's kernels, so the decode steps
here run the layers one by one, not in the engine's one-call decode path (shared/kernels/native/decode_layers.py,
bit-identical, ~5 ms a step faster at 16 sequences): "the rest" and the wrappers' share are what that path removes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

ELEMENTWISE = ("rms_norm", "fused_add_rms_norm", "apply_rotary", "silu_and_mul", "rope_store")


class _Clock:
    """Seconds and FLOPs by component, for the step kind being measured."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)

    def timed(self, tag: str, fn: Callable[..., Any], flops: Callable[..., float] | None = None) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds[tag] += time.perf_counter() - t
            if flops is not None:
                self.flops[tag] += flops(args, out)
            return out

        return call


class _TimedLinear:
    """A linear backend whose apply() is clocked under `tag` (FLOPs from the call's shapes: 2 x M x K x N), and its
    apply_gated() too (N = 2 x the call's outputs; its silu-and-mul epilogue counts as the GEMM's time)."""

    def __init__(self, inner: Any, clock: _Clock, tag: str) -> None:
        self.inner, self.name = inner, inner.name
        self.apply = clock.timed(tag, inner.apply, lambda a, out: 2.0 * a[0].shape[0] * a[0].shape[1] * out.shape[1])
        self.apply_gated = clock.timed(
            tag,
            inner.apply_gated,
            lambda a, out: 0.0 if out is None else 4.0 * a[0].shape[0] * a[0].shape[1] * out.shape[1],
        )

    def pack(self, weight: Any) -> Any:
        return self.inner.pack(weight)

    def pack_gated(self, weight: Any) -> Any:
        return self.inner.pack_gated(weight)

    def exact(self) -> Any:
        return self.inner.exact()


class _TimedAttention:
    """The attention backend with prepare() and forward() clocked."""

    def __init__(self, inner: Any, clock: _Clock) -> None:
        self.inner = inner
        self.prepare = clock.timed("attention", inner.prepare)
        self.forward = clock.timed("attention", inner.forward)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def instrument(engine: Any, clock: _Clock) -> None:
    """Put clocks around the engine's kernel calls (its model's linear backends, elementwise ops, attention)."""
    runner, model = engine.runner, engine.runner.model
    timed = {n: clock.timed("elementwise", getattr(model.ops, n)) for n in ELEMENTWISE if getattr(model.ops, n)}
    ops = dataclasses.replace(model.ops, **timed)
    model.ops = ops
    for layer in model.layers:
        layer.ops = ops
        layer.linear = _TimedLinear(layer.linear, clock, "qkv, o, gate_up")
        layer.exact = _TimedLinear(layer.exact, clock, "down")
    model.linear = _TimedLinear(model.linear, clock, "lm_head")
    runner.attn = _TimedAttention(runner.attn, clock)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or bundled name (default: the bundled SmolLM2-135M)")
    p.add_argument("--requests", type=int, default=16, help="requests in the wave (all admitted at once)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request (random ids)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens per request (ignore_eos)")
    p.add_argument("--gflops", type=float, default=0.0, help="the box's fp32 matmul rate (0: measure it)")


def run(ns: argparse.Namespace) -> int:
    for flag in ("requests", "input_len", "output_len"):
        if getattr(ns, flag) < 1:
            print(f"bench step_profile: --{flag.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    from pathlib import Path

    import torch

    from bench.serve.compare_report import matmul_gflops
    from bench.serve.main import DEFAULT_MODEL
    from shared.config import PassContext, resolve
    from shared.engine.engine import Engine
    from shared.modelspec.bundled import resolve_model_path

    model_dir = Path(resolve_model_path(ns.model or DEFAULT_MODEL))
    peak = ns.gflops or matmul_gflops(model_dir)
    cfg = resolve("worker", ["--model", str(model_dir)], env={}, ctx=PassContext(exclusive_host=True))
    engine = Engine.from_config(cfg)
    # matmul_gflops leaves torch on one thread: the engine's own count, or every core when it has none
    torch.set_num_threads(engine.threads or os.cpu_count() or 1)
    prof = profile_wave(engine, ns.requests, ns.input_len, ns.output_len)
    print(
        f"{model_dir.name}: {engine.threads or 'all'} threads, matmul peak {peak:.0f} GFLOPS; "
        f"a wave of {ns.requests} x {ns.input_len}/{ns.output_len}"
    )
    for kind in ("prefill", "decode"):
        _report(kind, prof.steps[kind], prof.clocks[kind], prof.kv_read[kind], peak)
    return 0


@dataclasses.dataclass
class Profile:
    """One timed wave, by step kind ("prefill": steps with prompt tokens, "decode": one token a request)."""

    steps: dict[str, list[tuple[Any, float]]]  # (the engine's StepStats, wall seconds) per step
    clocks: dict[str, _Clock]
    kv_read: dict[str, float]  # bytes of KV the steps' attention read


def profile_wave(engine: Any, requests: int, input_len: int, output_len: int) -> Profile:
    """A warm-up wave, then one wave with the engine's kernel calls clocked (the engine stays instrumented)."""
    from shared.modelspec.sampling import SamplingParams

    arch = engine.runner.arch
    kv_bytes_per_token = engine.runner.layout.page_bytes // engine.runner.layout.page_size  # K and V, or MLA's latent
    rng = random.Random(0)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)

    def wave(tag: str, each_step: Callable[[Any, float], None]) -> None:
        for i in range(requests):
            ids = [rng.randrange(100, min(arch.vocab_size, 40000)) for _ in range(input_len)]
            engine.add_request(f"{tag}-{i}", ids, params)
        while engine.has_work():
            t = time.perf_counter()
            engine.step()
            each_step(engine.stats.last_step, time.perf_counter() - t)

    wave("warm", lambda s, dt: None)
    prof = Profile({"prefill": [], "decode": []}, {"prefill": _Clock(), "decode": _Clock()}, defaultdict(float))
    current = _Clock()
    instrument(engine, current)

    def account(stats: Any, dt: float) -> None:
        kind = "decode" if stats.num_tokens == stats.num_seqs else "prefill"
        prof.steps[kind].append((stats, dt))
        # The KV this step's attention read: each running request's context (after the step; requests that
        # finished in it are gone, so the wave's last step counts short).
        prof.kv_read[kind] += sum(r.num_computed_tokens for r in engine.scheduler.running) * kv_bytes_per_token
        into = prof.clocks[kind]
        for k, v in current.seconds.items():
            into.seconds[k] += v
        for k, v in current.flops.items():
            into.flops[k] += v
        current.seconds.clear()
        current.flops.clear()

    wave("timed", account)
    return prof


def _report(kind: str, steps: Sequence[tuple[Any, float]], clock: _Clock, kv_bytes: float, peak: float) -> None:
    if not steps:
        print(f"{kind}: no steps")
        return
    n = len(steps)
    step_ms = 1e3 * sum(dt for _, dt in steps) / n
    tokens = sum(s.num_tokens for s, _ in steps) / n
    gemm_flops = sum(clock.flops.values())
    print(
        f"{kind}: {n} steps of {step_ms:.1f} ms, {tokens:.0f} tokens each; GEMM FLOPs at the matmul peak would take "
        f"{1e3 * gemm_flops / n / (peak * 1e9):.1f} ms a step"
    )
    rows = dict(clock.seconds)
    rows["sampling"] = sum(s.sample_s for s, _ in steps)
    rows["scheduler + batch"] = sum(s.schedule_s + s.prepare_s + s.update_s for s, _ in steps)
    rows["the rest (Python, call overhead)"] = max(0.0, sum(dt for _, dt in steps) - sum(rows.values()))
    for tag, sec in sorted(rows.items(), key=lambda kv: -kv[1]):
        ms = 1e3 * sec / n
        rate = ""
        if clock.flops.get(tag):
            rate = f"  {clock.flops[tag] / sec / 1e9:6.0f} GFLOPS"
        elif tag == "attention" and sec:
            rate = f"  {kv_bytes / sec / 1e9:6.1f} GB/s of KV"
        print(f"  {tag:34s} {ms:8.2f} ms  {100 * ms / step_ms:5.1f}%{rate}")


def main(argv: Sequence[str] | None = None) -> int:
    from bench.entry import bench_main

    return bench_main("bench.step_profile", __doc__ or "", add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
