"""Paged decode attention in C over the KV pool in place (CPU; q and out fp32, the cache fp32 or bf16): the `native`
backend's decode path.

Same contract as shared/kernels/decode_attention.paged_decode_attention (the torch reference it is tested
against), except that it reads q rows and writes out rows at `rows`, so decode tokens inside a mixed batch need no
index_select / index_copy, and every sequence attends to exactly its own length (no length groups, no mask).
"""

from __future__ import annotations

import torch

from shared.kernels.native.build import load_library


def check_cache(cache: torch.Tensor) -> None:
    """[num_pages, page_size, kv_heads, head_dim] fp32 or bf16 on CPU; one page of one layer contiguous (the pool's
    views)."""
    _, _, kv_heads, head_dim = cache.shape
    if cache.dtype not in (torch.float32, torch.bfloat16) or cache.device.type != "cpu":
        raise ValueError(f"native attention reads fp32 or bf16 CPU caches, got {cache.dtype} on {cache.device}")
    if cache.stride(3) != 1 or cache.stride(2) != head_dim or cache.stride(1) != kv_heads * head_dim:
        raise ValueError(f"native decode attention needs each page contiguous, got strides {cache.stride()}")


def native_paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    rows: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """out[rows[i]] = attention of q[rows[i]] ([heads, head_dim]) over sequence i's first seq_lens[i] cached tokens.

    q, out: [T, heads, head_dim] fp32, contiguous; k_cache, v_cache: as check_cache says (same strides and dtype: a
    bf16 cache is widened to fp32 as it is read);
    page_table: [n, max_pages] int64 contiguous; seq_lens, rows: [n] int64 contiguous (the current token's K/V
    already written). Raises ValueError on shapes the kernel's fixed buffers do not take (group > 16, head_dim > 256,
    page_size > 256).
    """
    n = seq_lens.shape[0]
    if n == 0:
        return
    check_cache(k_cache)
    if q.dtype != torch.float32 or out.dtype != torch.float32:
        raise ValueError(f"native decode attention takes fp32 q/out, got {q.dtype}/{out.dtype}")
    _, heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    assert q.is_contiguous() and out.is_contiguous() and out.shape == q.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.dtype == v_cache.dtype
    assert page_table.dtype == seq_lens.dtype == rows.dtype == torch.int64
    assert page_table.is_contiguous() and seq_lens.is_contiguous() and rows.is_contiguous()
    lib = load_library()
    kernel = lib.pdr_paged_decode_f32 if k_cache.dtype == torch.float32 else lib.pdr_paged_decode_bf16
    rc = kernel(
        q.data_ptr(),
        heads * head_dim,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.stride(0),
        page_table.data_ptr(),
        page_table.stride(0),
        seq_lens.data_ptr(),
        rows.data_ptr(),
        out.data_ptr(),
        heads * head_dim,
        n,
        heads,
        kv_heads,
        head_dim,
        page_size,
        scale,
        torch.get_num_threads(),
    )
    if rc != 0:
        raise ValueError(
            f"native decode attention does not take heads {heads} / kv_heads {kv_heads}, head_dim "
            f"{head_dim}, page_size {page_size}; use --attention-backend torch"
        )
