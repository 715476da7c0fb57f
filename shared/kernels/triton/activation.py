"""SiLU-and-multiply on the fused gate_up projection, as one Triton kernel.

x: [..., 2 * inter] holding [gate | up] -> silu(gate) * up: [..., inter]. The torch reference is
shared.kernels.activation.silu_and_mul; like it (silu in the input dtype, then the product) the kernel rounds the
silu to the input dtype before multiplying, so bf16 results agree to the last bit up to exp() rounding.
"""

from __future__ import annotations

import torch
import triton.language as tl

from shared.kernels.activation import silu_and_mul as reference
from shared.kernels.triton.launch import check_float, round_mode, triton_kernel

__all__ = ["reference", "silu_and_mul"]

_BLOCK = 1024  # elements of one row per program


@triton_kernel
def _silu_and_mul_kernel(X, Out, inter, stride_x, stride_o, BLOCK: tl.constexpr, ROUND_BF16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    if ROUND_BF16:  # round to nearest even by hand (the interpreter's cast truncates)
        u = silu.to(tl.uint32, bitcast=True)
        silu = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
    silu = silu.to(Out.dtype.element_ty).to(tl.float32)
    out = silu * up
    if ROUND_BF16:
        u = out.to(tl.uint32, bitcast=True)
        out = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
    tl.store(Out + row * stride_o + cols, out.to(Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., 2 * inter] -> silu(x[..., :inter]) * x[..., inter:]: [..., inter] (a new tensor unless `out`)."""
    check_float("x", x)
    two_inter = x.shape[-1]
    if two_inter % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension, got {two_inter}")
    inter = two_inter // 2
    x2 = x.reshape(-1, two_inter)  # [rows, 2 * inter]; a view whenever x's rows are evenly strided
    rows = x2.shape[0]
    if out is None:
        out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    elif out.shape != (*x.shape[:-1], inter) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {(*x.shape[:-1], inter)}")
    if rows == 0:
        return out
    grid = (rows, -(-inter // _BLOCK))
    _silu_and_mul_kernel.on(x.device)[grid](
        x2, out, inter, x2.stride(0), inter, BLOCK=_BLOCK, ROUND_BF16=round_mode(x.dtype, x.device)
    )
    return out
