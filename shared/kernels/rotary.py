"""Rotary position embedding (GPT-NeoX "rotate half" style, as Llama/Qwen use), torch reference.

The cos/sin cache is computed once in float32 exactly the way Hugging Face computes it (fp32 inv_freq times fp32
positions), so logits match HF to float rounding. Supported scalings: none ("default"), "linear" and "llama3" here,
"yarn" and "longrope" in rope_scaling.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from shared.kernels.rope_scaling import longrope, yarn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


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
    if rope_type in ("yarn", "longrope"):
        raise ValueError(f"rope scaling type {rope_type!r} scales cos/sin too: use RotaryCache")
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
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


class RotaryCache:
    """cos/sin tables for positions [0, max_positions): each [max_positions, head_dim // 2], float32."""

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        base: float,
        scaling: Mapping[str, Any] | None = None,
        device: torch.device | str = "cpu",
        model_max_positions: int
        | None = None,  # config.json's max_position_embeddings: yarn's / longrope's default factor
    ) -> None:
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        t = torch.arange(max_positions, dtype=torch.float32)
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
        attention = 1.0
        if kind in ("yarn", "longrope"):
            assert scaling is not None
            scaled = (yarn if kind == "yarn" else longrope)(head_dim, base, scaling, model_max_positions)
            freqs = torch.outer(t, scaled.inv_freq)
            if scaled.long_inv_freq is not None:  # each position on its side of the original length
                freqs[scaled.switch_at :] = torch.outer(t[scaled.switch_at :], scaled.long_inv_freq)
            attention = scaled.attention_factor
        else:
            freqs = torch.outer(t, rope_inv_freq(head_dim, base, scaling))  # [max_positions, head_dim // 2]
        self.cos = (freqs.cos() * attention).to(device)
        self.sin = (freqs.sin() * attention).to(device)

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
