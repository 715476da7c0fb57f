"""The long-context RoPE scalings, computed as transformers computes them (fp32 inverse frequencies), so logits match:

    yarn      NTK-by-parts: high frequencies kept, low ones divided by `factor`, a linear ramp between the two
              (beta_fast / beta_slow rotations), and cos/sin scaled by the attention factor (0.1 ln(factor) + 1, or
              DeepSeek's mscale / mscale_all_dim ratio). Qwen2/3, Mistral and DeepSeek checkpoints use it.
    longrope  Phi-3's per-frequency factors: `short_factor` up to original_max_position_embeddings, `long_factor`
              past it, cos/sin scaled by sqrt(1 + ln(factor) / ln(original max)).

Where longrope switches, transformers and pdrelay differ by design: transformers picks one set for the whole
sequence from its current length (so a sequence that grows past the original length rotates new keys with the long
factors while its cached keys keep the short ones), a paged cache cannot re-rotate stored keys, so here each
*position* uses the set of its side of the boundary. Within original_max_position_embeddings (4k for Phi-3-mini-128k)
both are exactly the short factors.

`dynamic` (dynamic NTK) is not supported: its frequencies depend on the sequence's current length, which a paged
cache whose keys were rotated earlier cannot follow; it is refused at start, naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ScaledRope:
    inv_freq: torch.Tensor  # [rotary_dim // 2] float32: every position (longrope: up to `switch_at`)
    attention_factor: float  # cos and sin are multiplied by it
    long_inv_freq: torch.Tensor | None = None  # longrope: positions >= switch_at
    switch_at: int = 0


def _factor(scaling: Mapping[str, Any], model_max_positions: int | None) -> float:
    """`factor`, or (DeepSeek-V3, Phi-3) the ratio of the model's context to the original one when it is unset."""
    factor = scaling.get("factor")
    if factor is not None:
        return float(factor)
    original = scaling.get("original_max_position_embeddings")
    if not original or not model_max_positions:
        raise ValueError("rope_scaling: factor is unset and cannot be derived from max_position_embeddings")
    return model_max_positions / float(original)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn(dim: int, base: float, scaling: Mapping[str, Any], model_max_positions: int | None) -> ScaledRope:
    factor = _factor(scaling, model_max_positions)
    original = float(scaling.get("original_max_position_embeddings") or model_max_positions or 0)
    if not original:
        raise ValueError("rope_scaling: yarn needs original_max_position_embeddings")
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all))
        else:
            attention = yarn_mscale(factor)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp  # share of each frequency kept as trained
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return ScaledRope(inv_freq, float(attention))


def longrope(dim: int, base: float, scaling: Mapping[str, Any], model_max_positions: int | None) -> ScaledRope:
    original = int(scaling.get("original_max_position_embeddings") or 0)
    if not original:
        raise ValueError("rope_scaling: longrope needs original_max_position_embeddings")
    factor = _factor(scaling, model_max_positions)
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim

    def inv(name: str) -> torch.Tensor:
        ext = torch.tensor(scaling[name], dtype=torch.float32)
        if ext.numel() != dim // 2:
            raise ValueError(f"rope_scaling: {name} has {ext.numel()} values, the rotary dims need {dim // 2}")
        return 1.0 / (ext * base**shape)

    return ScaledRope(inv("short_factor"), float(attention), inv("long_factor"), original)
