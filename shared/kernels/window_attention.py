"""Paged attention with a sliding window and/or logit soft-capping, torch reference (any device): the path every
attention backend takes for the layers that need either (Mistral, Phi-3, Qwen2/3 with use_sliding_window, Gemma 2's
soft-capped layers, Gemma 2/3's local layers).

Semantics are transformers' exactly: a query at position p sees the keys at positions k with p - window < k <= p
(window 0: every k <= p); with soft-capping the scaled scores become cap * tanh(scores / cap) before the mask and the
softmax (taken in float32).

Why the native C kernels (and Triton's) do not take these layers: they walk a sequence's pages from position 0 in
page-aligned blocks (16-token vector blocks with the next page prefetched, three variants: generic, AVX-512, AVX2),
so a window starting mid-page needs an offset threaded through every variant and through the extend kernel's causal
tiling, and soft-capping a tanh inside their fused online softmax; each is a kernel change with its own parity tests.
Until then these layers run here, reading the same pages in place of a gathered copy's kernel, and every other layer
keeps its fast kernel. Both paths read only the cache (the step's K/V are written before attention runs).
"""

from __future__ import annotations

import torch

from shared.kernels.attention_plan import AttentionMetadata


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """q [B, Lq, H, D], k/v [B, Lk, KVH, D], keep [B, Lq, Lk] bool -> [B, Lq, H, D].

    The same op order as transformers' eager attention: (q @ k^T) * scale, soft-cap, mask, float32 softmax, @ v.
    """
    b, lq, h, d = q.shape
    kvh = k.shape[2]
    qg = q.view(b, lq, kvh, h // kvh, d).permute(0, 2, 3, 1, 4)  # [B, KVH, G, Lq, D]
    kt = k.to(q.dtype).permute(0, 2, 3, 1).unsqueeze(2)  # [B, KVH, 1, D, Lk]
    vv = v.to(q.dtype).permute(0, 2, 1, 3).unsqueeze(2)  # [B, KVH, 1, Lk, D]
    scores = torch.matmul(qg, kt) * scale  # [B, KVH, G, Lq, Lk]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.float().masked_fill(~keep[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, vv)  # [B, KVH, G, Lq, D]
    return out.permute(0, 3, 1, 2, 4).reshape(b, lq, h, d)


def _decode_sets(
    meta: AttentionMetadata, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The step's decode sequences as (token_idx [n], page_table [n, pages], seq_lens [n]) sets, from whichever
    plan the backend made (flat, or length groups)."""
    if meta.flat_decode is not None:
        f = meta.flat_decode
        return [(f.token_idx, f.page_table, f.seq_lens)]
    out = []
    for g in meta.decode_groups:
        idx = g.token_idx if g.token_idx is not None else torch.arange(g.seq_lens.shape[0], device=device)
        out.append((idx, g.page_table, g.seq_lens))
    return out


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    scale: float,
    window: int,
    softcap: float,
    out: torch.Tensor,
) -> None:
    """One new token per sequence, a set at a time: gather the pages that can hold a visible key, mask, attend."""
    page = k_cache.shape[1]
    for token_idx, page_table, seq_lens in sets:
        n = seq_lens.shape[0]
        # pages before every sequence's window start are skipped (whole pages only: the mask does the rest)
        first = int((seq_lens - window).clamp(min=0).min().item()) // page if window else 0
        pt = page_table[:, first:]
        k = k_cache.index_select(0, pt.reshape(-1)).view(n, -1, *k_cache.shape[2:])  # [n, L, KVH, D]
        v = v_cache.index_select(0, pt.reshape(-1)).view(n, -1, *v_cache.shape[2:])
        pos = torch.arange(k.shape[1], device=q.device) + first * page  # [L]
        lens = seq_lens.unsqueeze(1)
        keep = pos.unsqueeze(0) < lens
        if window:
            keep &= pos.unsqueeze(0) >= lens - window
        o = _attend(q.index_select(0, token_idx).unsqueeze(1), k, v, keep.unsqueeze(1), scale, softcap)
        out.index_copy_(0, token_idx, o[:, 0])


def _extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int,
    softcap: float,
    out: torch.Tensor,
) -> None:
    """Each extend sequence alone: its new tokens over (the visible part of its prefix + themselves), from the cache."""
    page = k_cache.shape[1]
    for row, t0, p, n in zip(meta.extend_rows, meta.extend_token_starts, meta.extend_prefix_lens, meta.extend_lens):
        end = p + n
        first = max(0, p - window + 1) // page if window else 0  # the first query's oldest visible key's page
        pages = meta.page_table[row, first : -(-end // page)]
        k = k_cache.index_select(0, pages).flatten(0, 1)[: end - first * page]  # [Lk, KVH, D]
        v = v_cache.index_select(0, pages).flatten(0, 1)[: end - first * page]
        kpos = torch.arange(first * page, end, device=q.device)
        qpos = torch.arange(p, end, device=q.device).unsqueeze(1)
        keep = kpos.unsqueeze(0) <= qpos
        if window:
            keep &= kpos.unsqueeze(0) > qpos - window
        o = _attend(q[t0 : t0 + n].unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), keep.unsqueeze(0), scale, softcap)
        out[t0 : t0 + n] = o[0]


def window_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """q [T, heads, head_dim] -> [T, heads, head_dim] for every sequence of the step's plan (extend and decode),
    over K/V already written into k_cache, v_cache [num_pages, page_size, kv_heads, head_dim]."""
    out = torch.empty_like(q)
    _extend(q, k_cache, v_cache, meta, scale, window, softcap, out)
    _decode(q, k_cache, v_cache, _decode_sets(meta, q.device), scale, window, softcap, out)
    return out
