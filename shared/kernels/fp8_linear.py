"""The linear backend of FP8 block-wise weights (fp8_weight.Fp8BlockWeight): dequantize on the fly, then F.linear.

The weight stays one byte per element in memory; each call widens it, scales each block and runs the ordinary GEMM
(fp8_weight.py says why that is transformers' own arithmetic). A faster kernel (an fp8 GEMM on GPU, dequantization
inside the native CPU GEMM) would replace `apply`'s two lines and keep its results.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.kernels.linear import LinearBackend, PackedWeight


class Fp8Linear:
    """A LinearBackend running Fp8BlockWeight projections by dequantize + F.linear and every other weight (the
    lm_head, unquantized in these checkpoints) on the backend it wraps."""

    name = "fp8"

    def __init__(self, inner: LinearBackend) -> None:
        self.inner = inner

    def pack(self, weight: torch.Tensor) -> PackedWeight:
        return self.inner.pack(weight)

    def apply(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(packed, Fp8BlockWeight):
            b = bias if bias is None or bias.dtype == x.dtype else bias.to(x.dtype)
            return F.linear(x, packed.dequantize(x.dtype), b)
        return self.inner.apply(x, packed, bias)

    def exact(self) -> LinearBackend:
        return Fp8Linear(self.inner.exact())

    def pack_gated(self, weight: torch.Tensor) -> PackedWeight:
        return self.inner.pack_gated(weight)

    def apply_gated(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor | None:
        if isinstance(packed, Fp8BlockWeight):
            return None  # the caller runs apply, then silu_and_mul
        return self.inner.apply_gated(x, packed)
