"""The linear backend of quantized weights (fp8_weight.Fp8BlockWeight, int4_weight.Int4Weight): dequantize on the
fly, then F.linear.

The weight stays 1 byte (fp8) or half a byte (int4) per element in memory; each call widens it, scales it and runs
the ordinary GEMM (fp8_weight.py says why that is transformers' own arithmetic on the dequantized weights). A faster
kernel (an fp8 GEMM on GPU, dequantization inside the native CPU GEMM) would replace `apply`'s two lines and keep
its results.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.kernels.int4_weight import Int4Weight
from shared.kernels.linear import LinearBackend, PackedWeight


class DequantLinear:
    """A LinearBackend running quantized projections by dequantize + F.linear and every other weight (the lm_head,
    unquantized in these checkpoints) on the backend it wraps."""

    name = "dequant"

    def __init__(self, inner: LinearBackend) -> None:
        self.inner = inner

    def pack(self, weight: torch.Tensor) -> PackedWeight:
        return self.inner.pack(weight)

    def apply(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(packed, (Fp8BlockWeight, Int4Weight)):
            b = bias if bias is None or bias.dtype == x.dtype else bias.to(x.dtype)
            return F.linear(x, packed.dequantize(x.dtype), b)
        return self.inner.apply(x, packed, bias)

    def exact(self) -> LinearBackend:
        return DequantLinear(self.inner.exact())

    def pack_gated(self, weight: torch.Tensor) -> PackedWeight:
        return self.inner.pack_gated(weight)

    def apply_gated(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor | None:
        if isinstance(packed, (Fp8BlockWeight, Int4Weight)):
            return None  # the caller runs apply, then silu_and_mul
        return self.inner.apply_gated(x, packed)
