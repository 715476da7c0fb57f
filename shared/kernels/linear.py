"""The model's dense projections: torch's F.linear, or oneDNN over weights reordered once at load.

Why a second kernel on CPU: at decode batch sizes (M = 1-64 rows) torch's fp32 F.linear (MKL sgemm) streams each
weight matrix from DRAM at 5-8 GB/s, a third of the machine's copy rate. oneDNN's inner-product primitive over a
weight reordered once into its blocked layout measured 1.7-1.9x faster on the bundled model's layer shapes and
~3x on its lm_head at M = 16 (fp32, 2 threads, weights far larger than the caches), and ~1.4x at M = 2048
(prefill). vLLM's CPU backend makes the same choice (prepacked oneDNN GEMMs).

The model decides which projections take the fast kernel (see models/llama.py: the down projection stays on
F.linear for HF parity). A backend is chosen once per model runner, like the attention backend.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

LINEAR_BACKENDS = ("auto", "torch", "onednn")

# oneDNN picks its kernel blocking from a row-count hint when it reorders a weight; any row count runs afterwards.
# 16 is the decode batch the reorder is tuned for (measured: the hint changes nothing at M = 1-2048 here).
_REORDER_ROWS_HINT = 16


class LinearBackend(Protocol):
    name: str

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[out, in] weight -> the handle `apply` takes (may be the weight itself)."""
        ...

    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] -> [M, out] = x @ weight.T + bias."""
        ...


class TorchLinear:
    """F.linear: the same GEMM transformers runs (MKL on CPU, cuBLAS on GPU)."""

    name = "torch"

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return weight

    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, packed, bias)


class OneDnnLinear:
    """oneDNN inner product over a prepacked (opaque, oneDNN-layout) copy of the weight. CPU only.

    The first call at a new row count builds a oneDNN primitive (~1 ms per weight shape, cached by oneDNN after).
    """

    name = "onednn"

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"onednn linear packs 2-D CPU weights, got {tuple(weight.shape)} on {weight.device}")
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _REORDER_ROWS_HINT)

    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[0] == 0:  # no rows (a step where no sequence wants logits): oneDNN rejects empty shapes
            return x.new_empty((0, packed.shape[0]))
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def select_linear_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> LinearBackend:
    """'auto' | 'torch' | 'onednn' for weights of `dtype` on `device` -> a backend.

    auto: oneDNN for fp32 on CPU where torch was built with it, F.linear otherwise (on GPU cuBLAS is the fast
    path; for bf16 on CPU F.linear already runs oneDNN's bf16 GEMM).
    """
    dev = torch.device(device)
    if name not in LINEAR_BACKENDS:
        raise ValueError(f"linear_backend {name!r} is unknown; use one of: {', '.join(LINEAR_BACKENDS)}")
    if name == "auto":
        name = "onednn" if dev.type == "cpu" and dtype == torch.float32 and onednn_available() else "torch"
    if name == "onednn":
        if dev.type != "cpu":
            raise ValueError(f"linear_backend 'onednn' runs on cpu, not {dev.type}; use --linear-backend torch")
        if not onednn_available():
            raise ValueError(
                "linear_backend 'onednn' needs a torch built with oneDNN (mkldnn); use --linear-backend torch"
            )
        return OneDnnLinear()
    return TorchLinear()
