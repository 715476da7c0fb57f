"""One mixture-of-experts layer (shared/engine/models/moe.py) at decode batch sizes on CPU, against one dense GEMM
of the same FLOPs and against a Python loop over the experts.

    python -m bench.moe_layer [--tokens 16] [--hidden 1024] [--inter 512] [--experts 8] [--top-k 2]
                              [--threads 1] [--dtype float32] [--rounds 50]

The MoE layer is the whole block as the model runs it: router GEMM, softmax/top-k, sort by expert, the grouped
gate_up GEMM, SwiGLU, the grouped down GEMM, weighting and index_add_. Its FLOPs are those of tokens * top_k rows
through one expert-shaped MLP (the router's are tokens * experts * hidden, ~1% here). The dense baselines do
exactly those FLOPs: the same MLP over tokens * top_k rows (two GEMMs + SwiGLU), and one GEMM of
[tokens * top_k, hidden] x [hidden, 3 * inter]. Each expert gets its own weights, so at batch 16 with top-2 the MoE
layer reads the weights of every expert that has rows (up to `experts`), where the dense MLP reads one expert's:
at few rows both are bound by reading weights, not by FLOPs, and the weight bytes each reads are printed beside
the times.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from shared.engine.models.moe import MoEBlock


def _median_ms(fn: Callable[[], object], rounds: int, flush: torch.Tensor) -> float:
    """Median time of fn(), each call after `flush` is rewritten (untimed): the weights come from DRAM every
    call, as each layer's do in a model (the dense MLP's 6 MB would otherwise stay in the last-level cache)."""
    for _ in range(2):  # warm-up: page faults, oneDNN/MKL setup
        fn()
    times = []
    for _ in range(rounds):
        flush.add_(1.0)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _block(hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype) -> MoEBlock:
    g = torch.Generator().manual_seed(0)
    block = MoEBlock(hidden, inter, experts, top_k, True, dtype)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    block.post_load()
    return block


def _case(a: argparse.Namespace, tokens: int, dtype: torch.dtype, flush: torch.Tensor, read_gbs: float) -> None:
    block = _block(a.hidden, a.inter, a.experts, a.top_k, dtype)
    x = torch.randn(tokens, a.hidden, generator=torch.Generator().manual_seed(1)).to(dtype)
    rows = tokens * a.top_k
    # the dense baselines: one expert-shaped MLP (HF's [out, in] weights) over the routed rows, and one GEMM
    w13 = torch.randn(2 * a.inter, a.hidden).to(dtype) * 0.05
    w2 = torch.randn(a.hidden, a.inter).to(dtype) * 0.05
    wide = torch.randn(3 * a.inter, a.hidden).to(dtype) * 0.05
    xr = torch.randn(rows, a.hidden).to(dtype)

    def dense_mlp() -> torch.Tensor:
        gate, up = F.linear(xr, w13).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w2)

    with torch.no_grad():
        assert (block(x) - block.forward_loop(x)).abs().max().item() < 1e-2
        used = block.route(x)[1].unique().numel()
        times = {
            "grouped MoE layer": _median_ms(lambda: block(x), a.rounds, flush),
            "loop over experts": _median_ms(lambda: block.forward_loop(x), a.rounds, flush),
            "dense MLP, same FLOPs": _median_ms(dense_mlp, a.rounds, flush),
            "one dense GEMM, same FLOPs": _median_ms(lambda: F.linear(xr, wide), a.rounds, flush),
        }
    flops = 2 * rows * a.hidden * 3 * a.inter
    expert_bytes = 3 * a.inter * a.hidden * x.element_size()
    print(
        f"{tokens} tokens ({rows} routed rows over {used} of {a.experts} experts, {flops / 1e6:.0f} MFLOP); "
        f"weights read: MoE {used * expert_bytes / 1e6:.1f} MB, dense {expert_bytes / 1e6:.1f} MB"
    )
    for name, t in times.items():
        print(f"  {name:28s} {t:8.3f} ms  {flops / t / 1e6:7.1f} GFLOPS")
    t_moe, t_gemm = times["grouped MoE layer"], times["one dense GEMM, same FLOPs"]
    floor = used * expert_bytes / read_gbs / 1e6  # ms to stream the experts' weights once at the read rate
    print(
        f"  grouped MoE / one dense GEMM: {t_moe / t_gemm:.2f}x; / dense MLP: {t_moe / times['dense MLP, same FLOPs']:.2f}x;"
        f" loop / grouped: {times['loop over experts'] / t_moe:.2f}x; grouped / its weight-read floor"
        f" ({floor:.2f} ms): {t_moe / floor:.2f}x"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="16,64,256", help="tokens in the batch, comma-separated (decode: one each)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inter", type=int, default=512, help="each expert's intermediate size")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the default of a worker on a shared box)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    flush = torch.zeros(96 * 1024 * 1024 // 4)  # 96 MB: three times the last-level caches seen here
    t = _median_ms(lambda: flush.sum(), 5, torch.zeros(1))
    read_gbs = flush.numel() * 4 / t / 1e6
    print(
        f"moe layer: hidden {a.hidden}, {a.experts} experts of {a.inter}, top-{a.top_k}, {a.dtype}, "
        f"{a.threads} thread(s); read rate {read_gbs:.1f} GB/s (sum over 96 MB)"
    )
    for tokens in (int(n) for n in a.tokens.split(",")):
        _case(a, tokens, dtype, flush, read_gbs)


if __name__ == "__main__":
    main()
