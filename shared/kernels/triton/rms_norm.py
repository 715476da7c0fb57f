"""RMSNorm and the fused residual-add + RMSNorm, as one Triton kernel (one program per row).

Numerics follow the torch reference (shared.kernels.rms_norm) and Hugging Face's LlamaRMSNorm: the residual sum is
rounded to the input dtype (it is stored and is what the next layer reads), the row is normalised in float32, cast
back to the input dtype, then multiplied by the weight.
"""

from __future__ import annotations

import torch
import triton.language as tl

from shared.kernels.rms_norm import fused_add_rms_norm as fused_add_reference
from shared.kernels.rms_norm import rms_norm as reference
from shared.kernels.triton.launch import check_float, next_pow2, round_mode, triton_kernel

__all__ = ["fused_add_reference", "fused_add_rms_norm", "reference", "rms_norm"]


@triton_kernel
def _rms_norm_kernel(
    X,
    R,
    W,
    Out,
    ResOut,
    d,
    w_rows,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    stride_w,
    BLOCK_D: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ROUND_X_BF16: tl.constexpr,
    ROUND_OUT_BF16: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < d
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        if ROUND_X_BF16:  # round to nearest even by hand (the interpreter's cast truncates)
            u = x.to(tl.uint32, bitcast=True)
            x = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
        x = x.to(ResOut.dtype.element_ty)
        tl.store(ResOut + row * stride_ro + cols, x, mask=mask)
        x = x.to(tl.float32)
    # [BLOCK_D] float32; padding lanes are 0 and do not change the sum
    y = x * tl.rsqrt(tl.reduce(x * x, 0, tl.standard._sum_combine) / d + eps)
    if ROUND_X_BF16:
        u = y.to(tl.uint32, bitcast=True)
        y = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
    y = y.to(X.dtype.element_ty).to(tl.float32)  # HF order: cast back to the input dtype, then scale
    w = tl.load(W + (row % w_rows) * stride_w + cols, mask=mask, other=0.0).to(tl.float32)
    out = y * w
    if ROUND_OUT_BF16:
        u = out.to(tl.uint32, bitcast=True)
        out = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
    tl.store(Out + row * stride_o + cols, out.to(Out.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] -> [rows, d] with a contiguous last dim (a view when possible, else a copy)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _out(
    given: torch.Tensor | None, shape: torch.Size, dtype: torch.dtype, device: torch.device, name: str
) -> torch.Tensor:
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if given.shape != shape or given.dtype != dtype or not given.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {dtype} tensor of shape {tuple(shape)}")
    return given


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None,
    residual_out: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_float("x", x)
    check_float("weight", weight)
    d = x.shape[-1]
    if weight.dim() == 0 or weight.dim() > x.dim() or weight.shape != x.shape[x.dim() - weight.dim() :]:
        raise ValueError(
            f"weight of shape {tuple(weight.shape)} must match the trailing dims of x "
            f"{tuple(x.shape)} (a [d] weight, or Qwen3's [heads, d] per-head weight)"
        )
    x2 = _rows(x)
    w2 = weight.reshape(-1, d).contiguous()  # [w_rows, d]: row r of x uses weight row r % w_rows
    out = _out(out, x.shape, torch.promote_types(x.dtype, weight.dtype), x.device, "out")
    res_out = None
    r2 = x2
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}"
            )
        r2 = _rows(residual)
        res_out = _out(residual_out, x.shape, x.dtype, x.device, "residual_out")
    rows = x2.shape[0]
    if rows == 0:
        return out, res_out
    ro = res_out if res_out is not None else out
    _rms_norm_kernel.on(x.device)[(rows,)](
        x2,
        r2,
        w2,
        out,
        ro,
        d,
        w2.shape[0],
        float(eps),
        x2.stride(0),
        r2.stride(0),
        d,
        d,
        w2.stride(0),
        BLOCK_D=next_pow2(d),
        HAS_RESIDUAL=residual is not None,
        ROUND_X_BF16=round_mode(x.dtype, x.device),
        ROUND_OUT_BF16=round_mode(out.dtype, x.device),
    )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., d], weight [d] (or [heads, d] matching x's trailing dims) -> x / rms(x) * weight, [..., d]
    (a new contiguous tensor unless `out`)."""
    y, _ = _launch(x, None, weight, eps, out, None)
    return y


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual' = x + residual; returns (rms_norm(residual'), residual'), new tensors unless `out` /
    `residual_out` are given; the inputs are left untouched."""
    y, res_out = _launch(x, residual, weight, eps, out, residual_out)
    assert res_out is not None
    return y, res_out
