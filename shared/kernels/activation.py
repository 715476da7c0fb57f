"""SiLU-and-multiply: the gated MLP's activation on a fused gate_up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * inter] holding [gate | up] -> silu(gate) * up: [..., inter]."""
    d = x.shape[-1] // 2
    assert x.shape[-1] == 2 * d, f"silu_and_mul needs an even last dim, got {x.shape[-1]}"
    return F.silu(x[..., :d]) * x[..., d:]
