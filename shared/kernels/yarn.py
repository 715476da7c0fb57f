"""YaRN RoPE frequencies (DeepSeek-V2/V3's rope_type "yarn"), computed as transformers computes them, in float32.

Returns the inverse frequencies and the attention factor that multiplies cos and sin (so the rotated dims of q and
k each carry it once). DeepSeek's other yarn term, mscale_all_dim, scales the softmax instead (mla_config.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's mscale: 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim: int, base: float, params: Mapping[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim // 2] float32, attention_factor) for RoPE over `dim` dims; max_positions: the config's
    max_position_embeddings (the factor's fallback: that over original_max_position_embeddings)."""
    original = float(params["original_max_position_embeddings"])
    factor = float(params.get("factor") or max_positions / original)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, float(mscale)) / yarn_get_mscale(factor, float(mscale_all_dim))
        else:
            attention_factor = yarn_get_mscale(factor)
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:  # the dim whose wavelength fits `rotations` times in the context
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp  # 1: keep the high frequency as trained; 0: interpolate it by `factor`
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)
