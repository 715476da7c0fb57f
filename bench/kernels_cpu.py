"""The native CPU kernels alone, on a model's shapes, every layer's data from DRAM: paged decode attention, paged
extend (prefill) attention and the few-row GEMM, each timed as a step runs it (one call per layer, all layers).

    python -m bench.kernels_cpu [--model DIR] [--rounds 9] [--threads N]

Prints the median time of all layers' calls and its rate: GB/s of K/V read for decode attention, GFLOPS for
extend attention (causal FLOPs only) and for the GEMMs (the projections of every layer plus the LM head, which
at few rows stream their weights). Each layer gets its own K/V pages or weights, as many as the model has, so the
working set is the model's and not the last-level cache's. Run it at two commits to compare kernels; the engine's
view of the same kernels inside a step is `python -m bench.step_profile`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from shared.engine.models.config import ModelArchConfig

# (sequences, tokens each): 16 decoding sequences at the bench's 128/64 lengths (160 on average) and at 512
DECODE_CASES = ((16, 160), (16, 512), (4, 160))
# (name, prefix lengths, new lengths): a wave of prompts, one long prompt, chunks after a cached prefix
EXTEND_CASES = (
    ("16 x 128", (0,) * 16, (128,) * 16),
    ("1 x 512", (0,), (512,)),
    ("2 x 256 after 256", (256, 256), (256, 256)),
)
GEMM_ROWS = (1, 16)
PAGE = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or bundled name (default: the bundled SmolLM2-135M)")
    p.add_argument("--rounds", type=int, default=9, help="timed repetitions of each case (the median is printed)")
    p.add_argument("--threads", type=int, default=0, help="torch / OpenMP threads (0: every core)")
    p.add_argument("--layers", type=int, default=0, help="layers to run (0: the model's)")


def _median_s(fn: Callable[[], object], rounds: int) -> float:
    fn()  # warm-up: page faults, one-time setup
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def run(ns: argparse.Namespace) -> int:
    if ns.rounds < 1:
        print("bench kernels_cpu: --rounds must be >= 1", file=sys.stderr)
        return 2
    if ns.threads < 0 or ns.layers < 0:
        print("bench kernels_cpu: --threads and --layers must be >= 0", file=sys.stderr)
        return 2
    import torch

    from bench.serve.main import DEFAULT_MODEL
    from shared.engine.models.config import load_model_config
    from shared.kernels.native.build import native_available
    from shared.modelspec.bundled import resolve_model_path

    ok, why = native_available()
    if not ok:
        print(f"bench kernels_cpu: {why}", file=sys.stderr)
        return 1
    arch = load_model_config(resolve_model_path(ns.model or DEFAULT_MODEL))
    torch.set_num_threads(ns.threads or os.cpu_count() or 1)
    layers = ns.layers or arch.num_layers
    print(
        f"{arch.model_type}: {layers} layers, {arch.num_heads}/{arch.num_kv_heads} heads of {arch.head_dim}, "
        f"{torch.get_num_threads()} threads, median of {ns.rounds}"
    )
    _decode(arch, layers, ns.rounds)
    _extend(arch, layers, ns.rounds)
    _gemm(arch, layers, ns.rounds)
    return 0


def _pool(pages: int, layers: int, kvh: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's page-major pool [pages, layers, K/V, page, kv heads, d] and a shuffled page order."""
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(pages, layers, 2, PAGE, kvh, d, generator=g), torch.randperm(pages, generator=g)


def _decode(arch: ModelArchConfig, layers: int, rounds: int) -> None:
    import torch

    from shared.kernels.native.paged_decode import native_paged_decode

    h, kvh, d = arch.num_heads, arch.num_kv_heads, arch.head_dim
    for n, length in DECODE_CASES:
        per = -(-length // PAGE)
        pool, order = _pool(n * per, layers, kvh, d)
        table = order.view(n, per).contiguous()
        lens, rows = torch.full((n,), length, dtype=torch.int64), torch.arange(n)
        q = torch.randn(n, h, d)
        out = torch.empty_like(q)

        def step() -> None:
            for layer in range(layers):
                native_paged_decode(q, pool[:, layer, 0], pool[:, layer, 1], table, lens, rows, d**-0.5, out)

        s = _median_s(step, rounds)
        kv = n * length * layers * kvh * d * 2 * 4
        print(f"decode attention  {n:3d} x {length:4d} tokens   {1e3 * s:8.2f} ms  {kv / s / 1e9:6.1f} GB/s of K/V")


def _extend(arch: ModelArchConfig, layers: int, rounds: int) -> None:
    import torch

    from shared.kernels.native.paged_extend import native_paged_extend

    h, kvh, d = arch.num_heads, arch.num_kv_heads, arch.head_dim
    for name, prefix, new in EXTEND_CASES:
        per = max(-(-(p + e) // PAGE) for p, e in zip(prefix, new, strict=True))
        pool, order = _pool(len(new) * per, layers, kvh, d)
        table = order.view(len(new), per).contiguous()
        starts = [sum(new[:i]) for i in range(len(new))]
        q = torch.randn(sum(new), h, d)
        out = torch.empty_like(q)

        def step() -> None:
            for layer in range(layers):
                native_paged_extend(q, pool[:, layer, 0], pool[:, layer, 1], table, starts, prefix, new, d**-0.5, out)

        s = _median_s(step, rounds)
        # each new token: q.k and p.v over its prefix and the new tokens up to itself, 2 FLOPs a multiply-add
        flops = sum(4 * e * (p + (e + 1) / 2) * d * h for p, e in zip(prefix, new, strict=True)) * layers
        print(f"extend attention  {name:22s}  {1e3 * s:8.2f} ms  {flops / s / 1e9:6.1f} GFLOPS")


def _gemm(arch: ModelArchConfig, layers: int, rounds: int) -> None:
    import torch

    from shared.kernels.native.gemm import native_gemm, pack_panels

    hid, inter = arch.hidden_size, arch.intermediate_size
    q = arch.num_heads * arch.head_dim
    shapes = [(q + 2 * arch.num_kv_heads * arch.head_dim, hid), (hid, q), (2 * inter, hid), (hid, inter)] * layers
    shapes.append((arch.vocab_size, hid))
    g = torch.Generator().manual_seed(1)
    weights = [pack_panels(torch.randn(n, k, generator=g) * 0.02) for n, k in shapes]
    for m in GEMM_ROWS:
        xs = {k: torch.randn(m, k) for k in {k for _, k in shapes}}

        def step() -> None:
            for (n, k), w in zip(shapes, weights, strict=True):
                native_gemm(xs[k], w, n, None)

        s = _median_s(step, rounds)
        flops = sum(2 * m * n * k for n, k in shapes)
        wbytes = sum(4 * n * k for n, k in shapes)
        print(
            f"few-row GEMM      {m:3d} rows, every weight   {1e3 * s:8.2f} ms  {flops / s / 1e9:6.1f} GFLOPS  "
            f"{wbytes / s / 1e9:5.1f} GB/s of weights"
        )


def main(argv: Sequence[str] | None = None) -> int:
    from bench.entry import bench_main

    return bench_main("bench.kernels_cpu", __doc__ or "", add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
