"""RMSNorm and the fused residual-add + RMSNorm, torch reference implementations.

Numerics follow Hugging Face's LlamaRMSNorm: normalise in float32, cast back to the input dtype, then scale by the
weight. That order matters in bf16 (it is what the checkpoints were trained with).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dim.

    x: [..., d]; weight: any shape broadcastable to x whose last dim is d (Qwen3 passes [heads, d] to normalise
    the q and k heads of one fused projection in one call).
    """
    if x.dtype == torch.float32 and weight.shape == x.shape[-1:]:
        # One fused ATen op instead of six: at decode batch sizes these small ops are pure dispatch overhead.
        # Same numbers as the formula below in fp32; in bf16 torch scales before casting back, HF after, so the
        # formula is kept there.
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual' = x + residual; returns (rms_norm(residual'), residual').

    This is the pre-norm transformer's "add the sublayer output, normalise for the next sublayer" step; a GPU
    kernel fuses it into one pass, here it is two ops. Neither input is modified.
    """
    new_residual = x + residual
    return rms_norm(new_residual, weight, eps), new_residual
