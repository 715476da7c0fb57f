"""Paged decode attention (one query token per sequence), torch reference for CPU.

Each sequence's keys/values live in pages of a paged KV cache; the page table lists them in order. The torch path
gathers every sequence's pages with ONE index_select per K and V (pages are contiguous rows of the cache) into
[bs, max_len, kv_heads, head_dim], then runs one masked, GQA-grouped SDPA over the whole batch, so the cost per
layer is a handful of ops whatever the batch size (no per-sequence Python loop).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class GatherWorkspace:
    """Reusable gather buffers. Multi-MB tensors allocated fresh every layer cost page faults on CPU (measured: an
    index_select into a new 6 MB tensor takes ~3x longer than into a reused one), so the buffers only grow."""

    def __init__(self) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def get(
        self, rows: int, row_len: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        need = rows * row_len
        k = self._k
        if k is None or k.numel() < need or k.dtype != dtype or k.device != device:
            self._k = torch.empty(need, dtype=dtype, device=device)
            self._v = torch.empty(need, dtype=dtype, device=device)
        assert self._k is not None and self._v is not None
        return self._k[:need].view(rows, row_len), self._v[:need].view(rows, row_len)


def decode_mask(seq_lens: torch.Tensor, max_len: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask [bs, 1, 1, max_len] in the query dtype: 0 where position < seq_len, -inf after. Built once
    per step and shared by all layers (an additive mask measured faster than a boolean one in SDPA on CPU)."""
    pos = torch.arange(max_len, device=seq_lens.device)
    keep = pos.unsqueeze(0) < seq_lens.unsqueeze(1)  # [bs, max_len]
    zero = torch.zeros((), dtype=dtype, device=seq_lens.device)
    ninf = torch.full((), float("-inf"), dtype=dtype, device=seq_lens.device)
    return torch.where(keep, zero, ninf).view(seq_lens.shape[0], 1, 1, max_len)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    mask: torch.Tensor | None = None,
    workspace: GatherWorkspace | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its cached keys/values.

    q: [bs, heads, head_dim]; k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim] (strided views of the
    pool are fine as long as one page of one layer is contiguous); page_table: [bs, max_pages] int64 (entries past
    a sequence's last page are ignored but must be valid page ids); seq_lens: [bs] int64, the number of cached
    tokens to attend to, including the current one (its K/V must already be written). heads % kv_heads == 0 (GQA).
    mask: decode_mask(seq_lens, max_pages * page_size, q.dtype) if precomputed. Returns [bs, heads, head_dim].
    """
    bs, heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    assert heads % kv_heads == 0, f"heads {heads} not a multiple of kv_heads {kv_heads}"
    group = heads // kv_heads
    max_pages = page_table.shape[1]
    max_len = max_pages * page_size
    if mask is None:
        mask = decode_mask(seq_lens, max_len, q.dtype)

    flat = page_table.reshape(-1)
    k_rows, v_rows = k_cache.flatten(1), v_cache.flatten(1)  # [num_pages, page_size * kv_heads * head_dim]
    same = v_cache is k_cache  # MLA's absorbed attention: the latent rows are keys and values both, gathered once
    if workspace is not None:
        kb, vb = workspace.get(flat.numel(), k_rows.shape[1], k_rows.dtype, k_rows.device)
        torch.index_select(k_rows, 0, flat, out=kb)
        if same:
            vb = kb
        else:
            torch.index_select(v_rows, 0, flat, out=vb)
    else:
        kb = k_rows.index_select(0, flat)
        vb = kb if same else v_rows.index_select(0, flat)
    if kb.dtype != q.dtype:  # fp8 pages (engine/kv_pool.py): widened once gathered, in the pages' own units
        kb, vb = kb.to(q.dtype), vb.to(q.dtype)
    # [bs, kv_heads, max_len, head_dim]: permuted views of the gathered rows, no copy
    k = kb.view(bs, max_len, kv_heads, head_dim).transpose(1, 2)
    v = vb.view(bs, max_len, kv_heads, head_dim).transpose(1, 2)
    if q.dtype in (torch.float32, torch.float64):
        # SDPA's CPU kernel reads strided K/V and groups query heads per kv head itself (enable_gqa): no K/V copy,
        # no repeat_interleave; measured ~1.4x faster than matmul + softmax + matmul here.
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=group > 1)
    else:
        # bf16/fp16: SDPA's CPU kernel is ~5x slower than this for one query token (measured), so group the
        # query heads per kv head by hand and take the softmax in float32.
        qg = q.view(bs, kv_heads, group, head_dim)
        scores = torch.matmul(qg, k.transpose(-1, -2))  # [bs, kv_heads, group, max_len]
        probs = torch.softmax(scores.float() * scale + mask.float(), dim=-1).to(v.dtype)
        out = torch.matmul(probs, v)  # [bs, kv_heads, group, head_dim]
    return out.reshape(bs, heads, head_dim)
