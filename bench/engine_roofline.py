"""The engine benchmark's roofline: this machine's matmul rate and copy bandwidth, each step's FLOPs and bytes as
the engine ran it (MeteredRunner), and the floor they set on a workload's time (bench/engine.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol


def measure_machine(hidden: int, intermediate: int, batch: int) -> dict[str, float]:
    """Matmul GFLOPS on the model's MLP shape ([batch, hidden] x [hidden, intermediate], fp32; the faster of
    torch's F.linear and prepacked oneDNN, so the roofline is the best this machine does, whichever kernel the
    engine runs) and copy GB/s."""
    import torch

    from shared.kernels.linear import OneDnnLinear, TorchLinear, onednn_available

    a = torch.randn(batch, hidden)
    w = torch.randn(intermediate, hidden)
    gflops = 0.0
    for kernel in (TorchLinear(), OneDnnLinear()) if onednn_available() else (TorchLinear(),):
        packed = kernel.pack(w)
        for _ in range(3):
            kernel.apply(a, packed)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            kernel.apply(a, packed)
            reps += 1
        gflops = max(gflops, 2 * batch * hidden * intermediate * reps / (time.perf_counter() - t0) / 1e9)
    src = torch.empty(64 << 20, dtype=torch.float32).fill_(1.0)  # 256 MiB: far larger than the caches
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return {"matmul_gflops": gflops, "matmul_batch": batch, "copy_gbps": src.numel() * 4 / best / 1e9}


class Meter(Protocol):
    """Where run_engine records each step's work (cleared at the start of a run)."""

    flops: list[float]
    bytes: list[float]


@dataclass
class StepMeter:
    """Per-step FLOPs and bytes of what the engine actually ran (filled by MeteredRunner)."""

    flops: list[float] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)


class MeteredRunner:
    """Delegates to a ModelRunner and records each step's work for the roofline."""

    def __init__(self, runner: Any) -> None:
        self._r = runner
        a = runner.arch
        self.meter = StepMeter()
        q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        layer_params = a.hidden_size * (2 * q + 2 * kv) + 3 * a.hidden_size * a.intermediate_size
        self._layer_flops = 2 * a.num_layers * layer_params  # per token, all layers' matmuls
        self._head_flops = 2 * a.hidden_size * a.vocab_size  # per token that needs logits
        self._attn_flops = 4 * a.num_layers * q  # per (query token, context token) pair: QK^T and PV
        elt = runner.layout.dtype_bytes
        self._weight_bytes = runner.model.weight_bytes
        self._kv_token_bytes = a.num_layers * 2 * kv * elt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._r, name)

    def prepare(self, out: Any) -> Any:
        tokens = ctx_pairs = kv_read = logits = 0
        for s in out.seqs:
            n, start = len(s.token_ids), s.start_pos
            tokens += n
            ctx_pairs += n * start + n * (n + 1) // 2  # causal: token j attends to start + j + 1 positions
            kv_read += start + n
            logits += s.need_logits
        self.meter.flops.append(tokens * self._layer_flops + logits * self._head_flops + ctx_pairs * self._attn_flops)
        self.meter.bytes.append(self._weight_bytes + (kv_read + tokens) * self._kv_token_bytes)
        return self._r.prepare(out)

    def forward_batch(self, batch: Any) -> Any:
        return self._r.forward_batch(batch)


def roofline(res: dict[str, Any], machine: dict[str, float]) -> dict[str, float]:
    """Each step is bound by compute or by memory traffic, whichever takes longer; their sum is the floor."""
    flops, nbytes = res.pop("_meter")
    rate, bw = machine["matmul_gflops"] * 1e9, machine["copy_gbps"] * 1e9
    floor_s = sum(max(f / rate, b / bw) for f, b in zip(flops, nbytes, strict=True))
    compute_bound = sum(1 for f, b in zip(flops, nbytes, strict=True) if f / rate >= b / bw)
    return {
        "roofline_s": floor_s,
        "roofline_fraction": floor_s / res["elapsed_s"],
        "compute_bound_steps": compute_bound / max(1, len(flops)),
    }
