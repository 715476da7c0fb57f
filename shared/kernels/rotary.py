"""Rotary position embedding (GPT-NeoX "rotate half" style, as Llama/Qwen use), torch reference.

The cos/sin cache is computed once in float32 exactly the way Hugging Face computes it (fp32 inv_freq times fp32
positions), so logits match HF to float rounding. Supported scalings: none ("default"), "linear", "llama3" and
"yarn" (its attention factor folded into the cos/sin tables, as transformers applies it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_inv_freq(head_dim: int, base: float, scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] float32, with Llama-3 / linear scaling applied if given."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope scaling type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, base, factor, scaling)
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(
    inv_freq: torch.Tensor, dim: int, base: float, factor: float, scaling: Mapping[str, Any]
) -> torch.Tensor:
    """YaRN: the dims that turn fewer than beta_slow times over the original context are interpolated (divided by
    factor), those that turn more than beta_fast times are kept, with a linear ramp between (transformers' rule,
    including its `truncate` of the ramp's ends to whole dims, on by default)."""
    ctx = float(scaling["original_max_position_embeddings"])
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(ctx / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of one dim
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # the share of each dim's original frequency
    return (inv_freq / factor) * (1 - keep) + inv_freq * keep


def rope_attention_factor(scaling: Mapping[str, Any] | None) -> float:
    """The factor the cos/sin tables are multiplied by: YaRN's attention_factor (0.1 * ln(factor) + 1 unless the
    config gives it, or the mscale / mscale_all_dim ratio), 1 for every other scaling."""
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return mscale(float(m)) / mscale(float(m_all)) if m and m_all else mscale(1.0)


class RotaryCache:
    """cos/sin tables for positions [0, max_positions): each [max_positions, head_dim // 2], float32."""

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        base: float,
        scaling: Mapping[str, Any] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        inv_freq = rope_inv_freq(head_dim, base, scaling)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_positions, head_dim // 2]
        scale = rope_attention_factor(scaling)
        self.cos = (freqs.cos() * scale if scale != 1.0 else freqs.cos()).to(device)
        self.sin = (freqs.sin() * scale if scale != 1.0 else freqs.sin()).to(device)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (cos, sin), each [T, 1, head_dim // 2] in `dtype`, ready to broadcast over heads.

        Done once per forward and shared by all layers.
        """
        cos = self.cos.index_select(0, positions).to(dtype).unsqueeze(1)
        sin = self.sin.index_select(0, positions).to(dtype).unsqueeze(1)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by (cos, sin) [T, 1, head_dim // 2]; returns a new [T, heads, head_dim].

    NeoX style: the first and second halves of head_dim form the (real, imaginary) pairs.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
