"""Prefill / extend attention over a cached prefix, torch reference for CPU.

A sequence computes `extend_len` new tokens at positions [prefix_len, prefix_len + extend_len); its first
`prefix_len` keys/values are already in the paged cache (a prefix-cache hit or earlier prefill chunks). New token i
attends to the whole prefix and causally to new tokens 0..i. One SDPA call per sequence: prefill steps are few and
long, so the Python loop is cheap next to the matmuls.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def gather_prefix(cache: torch.Tensor, pages: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """cache [num_pages, page_size, kv_heads, head_dim], pages [>= ceil(prefix_len / page_size)] int64 ->
    [prefix_len, kv_heads, head_dim] (a copy)."""
    page_size = cache.shape[1]
    n = -(-prefix_len // page_size)
    return cache.index_select(0, pages[:n]).flatten(0, 1)[:prefix_len]


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    scale: float,
    *,
    rows: Sequence[int] | None = None,
    token_starts: Sequence[int] | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over (cached prefix + new tokens).

    q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] for the new tokens (the sequences' tokens in order,
    T = sum(extend_lens) unless token_starts says where each sequence's tokens are); k_cache, v_cache:
    [num_pages, page_size, kv_heads, head_dim]; page_table: [bs, max_pages] int64, row `rows[i]` (default i) holds
    sequence i's pages. Returns [T, heads, head_dim] (rows of q not covered by a sequence are left unset).
    """
    assert len(prefix_lens) == len(extend_lens)
    heads, kv_heads = q.shape[1], k.shape[1]
    assert heads % kv_heads == 0, f"heads {heads} not a multiple of kv_heads {kv_heads}"
    out = torch.empty_like(q)
    t0 = 0
    for i, (p, n) in enumerate(zip(prefix_lens, extend_lens)):
        if token_starts is not None:
            t0 = token_starts[i]
        qi, ki, vi = q[t0 : t0 + n], k[t0 : t0 + n], v[t0 : t0 + n]
        if p > 0:
            pages = page_table[rows[i] if rows is not None else i]
            # .to: fp8 pages (engine/kv_pool.py) widen to the new tokens' dtype (a no-op otherwise)
            ki = torch.cat((gather_prefix(k_cache, pages, p).to(ki.dtype), ki))
            vi = torch.cat((gather_prefix(v_cache, pages, p).to(vi.dtype), vi))
            # new token j (position p + j) sees keys 0..p + j: bottom-right aligned causal mask [n, p + n]
            key_pos = torch.arange(p + n, device=q.device)
            keep = key_pos.unsqueeze(0) <= key_pos[p:].unsqueeze(1)
            attn_mask, causal = keep, False
        else:
            attn_mask, causal = None, True
        o = F.scaled_dot_product_attention(
            qi.transpose(0, 1).unsqueeze(0),  # [1, heads, n, head_dim]
            ki.transpose(0, 1).unsqueeze(0),  # [1, kv_heads, p + n, head_dim]
            vi.transpose(0, 1).unsqueeze(0),
            attn_mask=attn_mask,
            is_causal=causal,
            scale=scale,
            enable_gqa=heads != kv_heads,
        )
        out[t0 : t0 + n] = o[0].transpose(0, 1)
        t0 += n
    return out
