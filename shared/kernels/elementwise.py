"""The model's non-attention kernels (RMSNorm, fused add + RMSNorm, rotary embedding, SiLU-and-mul), chosen once
with the attention backend: the Triton kernels where attention runs on Triton (on GPU, each replaces several eager
ops, which matters outside CUDA graphs and inside them alike), the torch references elsewhere.

Both sets share one signature per op (the Triton wrappers take extra keyword-only `out=` buffers the model does
not use), so the model calls `ops.rms_norm(...)` without knowing which one it holds. The `native` attention backend
(fp32 CPU) gets the C kernels of shared/kernels/native/elementwise.c for the add + RMSNorm and SiLU-and-mul, and
`rope_store`: RoPE, the K/V cache write and contiguous q/k in one call (None elsewhere: the model then rotates
with `apply_rotary` and writes through the KV pool).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shared.kernels import activation, rms_norm, rotary

# (qkv, heads, kv_heads, head_dim, cos, sin, k_cache, v_cache, pages, offsets) -> (q, k)
RopeStore = Callable[
    [
        torch.Tensor,
        int,
        int,
        int,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
    ],
    tuple[torch.Tensor, torch.Tensor],
]


@dataclass(frozen=True)
class ElementwiseOps:
    name: str  # "torch" | "native" | "triton"
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    fused_add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    apply_rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    rope_store: RopeStore | None = None


TORCH_OPS = ElementwiseOps(
    name="torch",
    rms_norm=rms_norm.rms_norm,
    fused_add_rms_norm=rms_norm.fused_add_rms_norm,
    apply_rotary=rotary.apply_rotary,
    silu_and_mul=activation.silu_and_mul,
)


def elementwise_ops(backend: str) -> ElementwiseOps:
    """The ops that go with a selected attention backend's name ('torch', 'native' or 'triton')."""
    if backend == "torch":
        return TORCH_OPS
    if backend == "native":  # selected only where the C kernels built (dispatch.select_attention_backend)
        from shared.kernels.native import elementwise as n_ops

        return ElementwiseOps(
            name="native",
            rms_norm=rms_norm.rms_norm,  # one ATen op already (layer 0 and Qwen3's q/k norm)
            fused_add_rms_norm=n_ops.fused_add_rms_norm,
            apply_rotary=rotary.apply_rotary,  # Qwen3 (q/k norm between projection and rotation) still uses it
            silu_and_mul=n_ops.silu_and_mul,
            rope_store=n_ops.rope_store,
        )
    if backend != "triton":
        raise ValueError(f"no elementwise kernels for attention backend {backend!r}; use 'torch', 'native' or 'triton'")
    # imported here: a torch-backend worker never pays for loading triton
    from shared.kernels.triton import activation as t_act
    from shared.kernels.triton import rms_norm as t_norm
    from shared.kernels.triton import rotary as t_rot

    return ElementwiseOps(
        name="triton",
        rms_norm=t_norm.rms_norm,
        fused_add_rms_norm=t_norm.fused_add_rms_norm,
        apply_rotary=t_rot.apply_rotary,
        silu_and_mul=t_act.silu_and_mul,
    )
