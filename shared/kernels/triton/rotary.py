"""Rotary position embedding (NeoX "rotate half", as Llama/Qwen use) as one Triton kernel.

One program per token rotates all its heads: x [T, heads, head_dim] with (cos, sin) [T, 1, head_dim // 2] from
shared.kernels.rotary.RotaryCache.lookup. The torch reference is shared.kernels.rotary.apply_rotary; it rounds
each product to the input dtype, the kernel rounds once, so bf16 results may differ in the last bit.
"""

from __future__ import annotations

import torch
import triton.language as tl

from shared.kernels.rotary import apply_rotary as reference
from shared.kernels.triton.launch import check_float, next_pow2, round_mode, triton_kernel

__all__ = ["apply_rotary", "reference"]


@triton_kernel
def _rotary_kernel(
    X,
    Cos,
    Sin,
    Out,
    heads,
    half,
    stride_xt,
    stride_xh,
    stride_ct,
    stride_st,
    stride_ot,
    stride_oh,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    jmask = j < half
    mask = (h[:, None] < heads) & jmask[None, :]
    c = tl.load(Cos + t * stride_ct + j, mask=jmask, other=0.0).to(tl.float32)[None, :]  # [1, BLOCK_HALF]
    s = tl.load(Sin + t * stride_st + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
    x_ptr = X + t * stride_xt + h[:, None] * stride_xh + j[None, :]  # first halves, [BLOCK_H, BLOCK_HALF]
    x1 = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + half, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    if ROUND_BF16:  # round to nearest even by hand (the interpreter's cast truncates)
        u = o1.to(tl.uint32, bitcast=True)
        o1 = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
        u = o2.to(tl.uint32, bitcast=True)
        o2 = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
    o_ptr = Out + t * stride_ot + h[:, None] * stride_oh + j[None, :]
    tl.store(o_ptr, o1.to(Out.dtype.element_ty), mask=mask)
    tl.store(o_ptr + half, o2.to(Out.dtype.element_ty), mask=mask)


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] (any row/head strides, contiguous last dim) by (cos, sin), each
    [T, 1, head_dim // 2] or [T, head_dim // 2]; returns [T, heads, head_dim] in x's dtype (a new contiguous
    tensor unless `out`, which may not overlap x)."""
    check_float("x", x)
    if x.dim() != 3 or x.shape[-1] % 2:
        raise ValueError(f"x must be [tokens, heads, head_dim] with an even head_dim, got {tuple(x.shape)}")
    t, heads, d = x.shape
    half = d // 2
    c, s = cos.reshape(t, half), sin.reshape(t, half)  # [T, head_dim // 2] views of the lookup
    for name, v in (("cos", c), ("sin", s)):
        check_float(name, v)
    if out is None:
        out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    elif out.shape != x.shape or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {x.dtype} tensor of shape {tuple(x.shape)} with a contiguous last dim")
    if t == 0:
        return out
    _rotary_kernel.on(x.device)[(t,)](
        x,
        c,
        s,
        out,
        heads,
        half,
        x.stride(0),
        x.stride(1),
        c.stride(0),
        s.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_H=max(2, next_pow2(heads)),
        BLOCK_HALF=max(2, next_pow2(half)),
        ROUND_BF16=round_mode(x.dtype, x.device),
    )
    return out
