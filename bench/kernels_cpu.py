"""The native CPU kernels alone, on a model's shapes, every layer's data from DRAM: paged decode attention, paged
extend (prefill) attention and the few-row GEMM, each timed as a step runs it (one call per layer, all layers).

    python -m bench.kernels_cpu [--model DIR] [--rounds 9] [--threads N] [--dtypes float32,bfloat16]

Prints the median time of all layers' calls and its rate: GB/s of K/V read for decode attention, GFLOPS for
extend attention (causal FLOPs only) and for the GEMMs (the projections of every layer plus the LM head, which
at few rows stream their weights). Each layer gets its own K/V pages or weights, as many as the model has, so the
working set is the model's and not the last-level cache's. Run it at two commits to compare kernels; the engine's
view of the same kernels inside a step is `python -m bench.step_profile`.

Each table runs once per dtype: float32, and bfloat16 where the CPU runs the bf16 kernels (bf16 weights and K/V
cache, fp32 activations). Before them it measures the box's roofline: the matmul rate of a large GEMM in fp32 and
in bf16 (oneDNN through F.linear: vdpbf16ps / AMX where the CPU has them) and the read rate of a buffer far larger
than the caches (both with every thread the bench runs); each kernel's line gives its share of the one that bounds it (GFLOPS of the matmul rate, GB/s of
the read rate).
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
GEMM_ROWS = (1, 16, 64)
PAGE = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or bundled name (default: the bundled SmolLM2-135M)")
    p.add_argument("--rounds", type=int, default=9, help="timed repetitions of each case (the median is printed)")
    p.add_argument("--threads", type=int, default=0, help="torch / OpenMP threads (0: every core)")
    p.add_argument("--layers", type=int, default=0, help="layers to run (0: the model's)")
    p.add_argument(
        "--dtypes", default="float32,bfloat16", help="weights and K/V dtypes to run (bfloat16: where the CPU runs it)"
    )


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
    from shared.kernels.native.gemm import bf16_kernels

    layers = ns.layers or arch.num_layers
    dtypes = [torch.float32 if d == "float32" else torch.bfloat16 for d in ns.dtypes.split(",")]
    if torch.bfloat16 in dtypes and not bf16_kernels():
        print("bench kernels_cpu: no avx512_bf16 here: bfloat16 skipped", file=sys.stderr)
        dtypes.remove(torch.bfloat16)
    print(
        f"{arch.model_type}: {layers} layers, {arch.num_heads}/{arch.num_kv_heads} heads of {arch.head_dim}, "
        f"{torch.get_num_threads()} threads, median of {ns.rounds}"
    )
    roof = _roofline(ns.rounds)
    print(
        f"roofline: matmul fp32 {roof['float32']:.0f} GFLOPS, bf16 {roof['bfloat16']:.0f} GFLOPS; "
        f"read {roof['read']:.1f} GB/s"
    )
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        print(f"-- {name} (weights and K/V cache; activations fp32)")
        _decode(arch, layers, ns.rounds, dtype, roof["read"])
        _extend(arch, layers, ns.rounds, dtype, roof[name])
        _gemm(arch, layers, ns.rounds, dtype, roof[name], roof["read"])
    return 0


def _roofline(rounds: int) -> dict[str, float]:
    """GFLOPS of a 2048-cube GEMM in fp32 and bf16 (F.linear: oneDNN), GB/s of summing a 512 MiB fp32 buffer."""
    import torch
    import torch.nn.functional as F

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)

        def gemm(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return F.linear(a, b)

        out[str(dtype).removeprefix("torch.")] = 2 * 2048**3 / _median_s(gemm, rounds) / 1e9
    big = torch.ones(1 << 27)  # 512 MiB: 16x the largest L3 here
    out["read"] = big.numel() * 4 / _median_s(big.sum, rounds) / 1e9
    return out


def _share(rate: float, roof: float) -> str:
    return f"{100 * rate / roof:4.0f}%" if roof > 0 else ""


def _pool(pages: int, layers: int, kvh: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's page-major pool [pages, layers, K/V, page, kv heads, d] and a shuffled page order."""
    import torch

    g = torch.Generator().manual_seed(0)
    pool = torch.randn(pages, layers, 2, PAGE, kvh, d, generator=g).to(dtype)
    return pool, torch.randperm(pages, generator=g)


def _decode(arch: ModelArchConfig, layers: int, rounds: int, dtype: torch.dtype, read: float) -> None:
    import torch

    from shared.kernels.native.paged_decode import native_paged_decode

    h, kvh, d = arch.num_heads, arch.num_kv_heads, arch.head_dim
    for n, length in DECODE_CASES:
        per = -(-length // PAGE)
        pool, order = _pool(n * per, layers, kvh, d, dtype)
        table = order.view(n, per).contiguous()
        lens, rows = torch.full((n,), length, dtype=torch.int64), torch.arange(n)
        q = torch.randn(n, h, d)
        out = torch.empty_like(q)

        def step() -> None:
            for layer in range(layers):
                native_paged_decode(q, pool[:, layer, 0], pool[:, layer, 1], table, lens, rows, d**-0.5, out)

        s = _median_s(step, rounds)
        kv = n * length * layers * kvh * d * 2 * pool.element_size()
        rate = kv / s / 1e9
        print(
            f"decode attention  {n:3d} x {length:4d} tokens   {1e3 * s:8.2f} ms  {rate:6.1f} GB/s of K/V "
            f"{_share(rate, read)} of read"
        )


def _extend(arch: ModelArchConfig, layers: int, rounds: int, dtype: torch.dtype, roof: float) -> None:
    import torch

    from shared.kernels.native.paged_extend import native_paged_extend

    h, kvh, d = arch.num_heads, arch.num_kv_heads, arch.head_dim
    for name, prefix, new in EXTEND_CASES:
        per = max(-(-(p + e) // PAGE) for p, e in zip(prefix, new, strict=True))
        pool, order = _pool(len(new) * per, layers, kvh, d, dtype)
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
        rate = flops / s / 1e9
        print(f"extend attention  {name:22s}  {1e3 * s:8.2f} ms  {rate:6.1f} GFLOPS {_share(rate, roof)} of matmul")


def _gemm(arch: ModelArchConfig, layers: int, rounds: int, dtype: torch.dtype, roof: float, read: float) -> None:
    import torch

    from shared.kernels.native.gemm import native_gemm, pack_panels

    hid, inter = arch.hidden_size, arch.intermediate_size
    q = arch.num_heads * arch.head_dim
    shapes = [(q + 2 * arch.num_kv_heads * arch.head_dim, hid), (hid, q), (2 * inter, hid), (hid, inter)] * layers
    shapes.append((arch.vocab_size, hid))
    g = torch.Generator().manual_seed(1)
    weights = [pack_panels((torch.randn(n, k, generator=g) * 0.02).to(dtype)) for n, k in shapes]
    for m in GEMM_ROWS:
        xs = {k: torch.randn(m, k) for k in {k for _, k in shapes}}

        def step() -> None:
            for (n, k), w in zip(shapes, weights, strict=True):
                native_gemm(xs[k], w, n, None)

        s = _median_s(step, rounds)
        flops = sum(2 * m * n * k for n, k in shapes)
        wbytes = sum(weights[0].element_size() * n * k for n, k in shapes)
        gf, gb = flops / s / 1e9, wbytes / s / 1e9
        print(
            f"few-row GEMM      {m:3d} rows, every weight   {1e3 * s:8.2f} ms  {gf:6.1f} GFLOPS {_share(gf, roof)} "
            f"of matmul  {gb:5.1f} GB/s of weights {_share(gb, read)} of read"
        )


def main(argv: Sequence[str] | None = None) -> int:
    from bench.entry import bench_main

    return bench_main("bench.kernels_cpu", __doc__ or "", add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
