"""The decoder layer's elementwise ops in C (elementwise.c), fp32 activations on CPU: the `native` backend's set (a
bf16 model's native path keeps its activations in fp32 too; only rope_store's K/V cache may be bf16).

Same contracts as the torch references (shared/kernels/rms_norm.py, activation.py) they are tested against, plus
one fused op the references do in several: `rope_store` rotates q and k, writes K/V into their cache slots and
hands back q and k contiguous, where the torch path runs the rotation, a concatenation, two index_put_ and a copy.
"""

from __future__ import annotations

import torch

from shared.kernels.native.build import load_library


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as fp32 rows the kernels read in place (each row contiguous, any row stride)."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"native elementwise ops take fp32 CPU tensors, got {x.dtype} on {x.device}")
    return x if x.stride(-1) == 1 else x.contiguous()


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual' = x + residual; returns (rms_norm(residual'), residual') for [T, d] rows. Inputs unchanged."""
    x, residual = _rows(x), _rows(residual)
    t, d = x.shape
    assert residual.shape == x.shape and weight.shape == (d,) and weight.is_contiguous()
    normed = torch.empty((t, d), dtype=torch.float32)
    new_residual = torch.empty((t, d), dtype=torch.float32)
    load_library().pdr_add_rms_norm_f32(
        x.data_ptr(),
        x.stride(0),
        residual.data_ptr(),
        residual.stride(0),
        weight.data_ptr(),
        normed.data_ptr(),
        new_residual.data_ptr(),
        t,
        d,
        eps,
        torch.get_num_threads(),
    )
    return normed, new_residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 * inter] holding [gate | up] -> silu(gate) * up: [T, inter]."""
    x = _rows(x)
    t, two = x.shape
    inter = two // 2
    assert two == 2 * inter, f"silu_and_mul needs an even last dim, got {two}"
    out = torch.empty((t, inter), dtype=torch.float32)
    load_library().pdr_silu_mul_f32(x.data_ptr(), x.stride(0), out.data_ptr(), t, inter, torch.get_num_threads())
    return out


def rope_store(
    qkv: torch.Tensor,
    heads: int,
    kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pages: torch.Tensor,
    offsets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv [T, (heads + 2 * kv_heads) * head_dim] (q | k | v per row) -> (q [T, heads, d], k [T, kv_heads, d]),
    rotated by cos/sin ([T, 1, d / 2], as RotaryCache.lookup gives them), contiguous; the rotated k and the v of
    token i are stored at (pages[i], offsets[i]) of the caches ([num_pages, page_size, kv_heads, d], each page
    contiguous; fp32, or bf16 rounded to nearest even as torch's .to(bfloat16) rounds), as KVPool.write would."""
    qkv = _rows(qkv)
    t = qkv.shape[0]
    assert qkv.shape[1] == (heads + 2 * kv_heads) * head_dim
    assert cos.is_contiguous() and sin.is_contiguous() and cos.numel() == t * (head_dim // 2)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(1) == kv_heads * head_dim
    assert k_cache.stride(2) == head_dim and k_cache.stride(3) == 1 and k_cache.dtype == v_cache.dtype
    assert k_cache.dtype in (torch.float32, torch.bfloat16)
    assert pages.dtype == offsets.dtype == torch.int64 and pages.is_contiguous() and offsets.is_contiguous()
    q = torch.empty((t, heads, head_dim), dtype=torch.float32)
    k = torch.empty((t, kv_heads, head_dim), dtype=torch.float32)
    lib = load_library()
    kernel = lib.pdr_rope_store_f32 if k_cache.dtype == torch.float32 else lib.pdr_rope_store_bf16
    rc = kernel(
        qkv.data_ptr(),
        qkv.stride(0),
        t,
        heads,
        kv_heads,
        head_dim,
        cos.data_ptr(),
        sin.data_ptr(),
        q.data_ptr(),
        k.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.stride(0),
        k_cache.shape[0],
        k_cache.shape[1],
        pages.data_ptr(),
        offsets.data_ptr(),
        torch.get_num_threads(),
    )
    if rc != 0:
        raise IndexError(f"a K/V slot lies outside the cache of {k_cache.shape[0]} x {k_cache.shape[1]} slots")
    return q, k
