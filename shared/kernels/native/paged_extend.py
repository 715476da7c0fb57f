"""Paged extend (prefill) attention in C over the KV pool in place (CPU; q and out fp32, the cache fp32 or bf16): the
`native` backend's extend path.

Same contract as shared/kernels/extend_attention.extend_attention (the torch reference it is tested against), except
that every key and value, the new tokens' included, is read from the pages: the caller has written the new tokens'
K/V into the cache before (the model's rope_store / KVPool.write), so no prefix is gathered and no mask is built.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared.kernels.native.build import load_library
from shared.kernels.native.paged_decode import check_cache


def native_paged_extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    starts: Sequence[int],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    scale: float,
    out: torch.Tensor,
) -> None:
    """out[starts[i] + j] = causal attention of q[starts[i] + j] ([heads, head_dim], position prefix_lens[i] + j)
    over sequence i's first prefix_lens[i] + j + 1 cached tokens, for j < extend_lens[i].

    q, out: [T, heads, head_dim] fp32 contiguous; k_cache, v_cache: as check_cache says (same strides and dtype: a
    bf16 cache is widened to fp32 as it is read); page_table:
    [n, max_pages] int64 contiguous, row i for sequence i. Raises ValueError on a head_dim past the kernel's buffers.
    """
    n = len(extend_lens)
    if n == 0:
        return
    check_cache(k_cache)
    if q.dtype != torch.float32 or out.dtype != torch.float32:
        raise ValueError(f"native extend attention takes fp32 q/out, got {q.dtype}/{out.dtype}")
    _, heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    assert q.is_contiguous() and out.is_contiguous() and out.shape == q.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.dtype == v_cache.dtype
    assert page_table.dtype == torch.int64 and page_table.is_contiguous() and page_table.shape[0] == n
    plan = torch.tensor([list(starts), list(prefix_lens), list(extend_lens)], dtype=torch.int64)  # [3, n]
    lib = load_library()
    kernel = lib.pdr_paged_extend_f32 if k_cache.dtype == torch.float32 else lib.pdr_paged_extend_bf16
    rc = kernel(
        q.data_ptr(),
        heads * head_dim,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.stride(0),
        page_table.data_ptr(),
        page_table.stride(0),
        plan[0].data_ptr(),
        plan[1].data_ptr(),
        plan[2].data_ptr(),
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
            f"native extend attention does not take heads {heads} / kv_heads {kv_heads}, head_dim {head_dim}; "
            "use --attention-backend torch"
        )
