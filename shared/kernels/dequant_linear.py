"""The linear backend of quantized weights (fp8_weight.Fp8BlockWeight, int4_weight.Int4Weight): dequantize on the
fly, then F.linear.

The weight stays 1 byte (fp8) or half a byte (int4) per element in memory; each call widens it, scales it and runs
the ordinary GEMM (fp8_weight.py says why that is transformers' own arithmetic on the dequantized weights). On CPU
with fp32 activations the widening runs in C (native/dequant.py, bit-identical, ~8x faster than torch's float8
conversion) into one scratch buffer the size of the largest projection, reused by every call: no fresh fp32 weight
allocated (and page-faulted) per call, and the 1-byte weights stay the only copy. A faster kernel (an fp8 GEMM on
GPU, dequantization inside the native CPU GEMM's tiles) would replace `_dequantize` and keep its results.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.kernels.int4_weight import Int4Weight
from shared.kernels.linear import LinearBackend, PackedWeight
from shared.kernels.native.build import native_available
from shared.kernels.native.dequant import dequantize_into


class DequantLinear:
    """A LinearBackend running quantized projections by dequantize + F.linear and every other weight (the lm_head,
    unquantized in these checkpoints) on the backend it wraps."""

    name = "dequant"

    def __init__(self, inner: LinearBackend) -> None:
        self.inner = inner
        self._native = native_available()[0]
        self._scratch = torch.empty(0)  # fp32, grown to the largest projection on first use

    def _dequantize(self, packed: Fp8BlockWeight | Int4Weight, x: torch.Tensor) -> torch.Tensor:
        """packed in x's dtype: natively into the scratch buffer (fp32 on CPU), else the torch reference."""
        if not (self._native and x.dtype == torch.float32 and x.device.type == "cpu"):
            return packed.dequantize(x.dtype)
        rows, cols = packed.shape
        if self._scratch.numel() < rows * cols:
            self._scratch = torch.empty(rows * cols, dtype=torch.float32)
        return dequantize_into(packed, self._scratch)

    def pack(self, weight: torch.Tensor) -> PackedWeight:
        return self.inner.pack(weight)

    def apply(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(packed, (Fp8BlockWeight, Int4Weight)):
            b = bias if bias is None or bias.dtype == x.dtype else bias.to(x.dtype)
            return F.linear(x, self._dequantize(packed, x), b)
        return self.inner.apply(x, packed, bias)

    def exact(self) -> LinearBackend:
        return DequantLinear(self.inner.exact())

    def pack_gated(self, weight: torch.Tensor) -> PackedWeight:
        return self.inner.pack_gated(weight)

    def apply_gated(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor | None:
        if isinstance(packed, (Fp8BlockWeight, Int4Weight)):
            return None  # the caller runs apply, then silu_and_mul
        return self.inner.apply_gated(x, packed)
