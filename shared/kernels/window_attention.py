"""Paged attention with a sliding window, logit soft-capping and/or attention sinks, torch reference (any device): the
path every attention backend takes for the layers that need one (Mistral, Phi-3, Qwen2/3 with use_sliding_window,
Gemma 2's soft-capped layers, Gemma 2/3's local layers, gpt-oss's sinks).

Semantics are transformers' exactly: a query at position p sees the keys at positions k with p - window < k <= p
(window 0: every k <= p); with soft-capping the scaled scores become cap * tanh(scores / cap) before the mask and the
softmax (taken in float32); with sinks, each head's sink logit joins the softmax as one more column that is then
dropped (it takes probability mass from the keys and gives no value).

Why the native C kernels (and Triton's) do not take these layers: they walk a sequence's pages from position 0 in
page-aligned blocks (16-token vector blocks with the next page prefetched, three variants: generic, AVX-512, AVX2),
so a window starting mid-page needs an offset threaded through every variant and through the extend kernel's causal
tiling, and soft-capping a tanh inside their fused online softmax; each is a kernel change with its own parity tests.
Until then these layers run here whenever their window is shorter than the step's longest sequence (needs_window_path;
otherwise the window changes nothing and the backend's own kernels run), and every other layer keeps its fast kernel.
Both paths read only the cache (the step's K/V are written before attention runs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.kernels.attention_plan import AttentionMetadata


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    scale: float,
    softcap: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Lq, H, D], k/v [B, Lk, KVH, D], keep [B, Lq, Lk] bool -> [B, Lq, H, D].

    Without soft-capping: one masked SDPA call (GQA-grouped, no K/V copy). With it, the op order of transformers'
    eager attention: (q @ k^T) * scale, soft-cap, mask, float32 softmax, @ v; the query heads of a KV head are
    stacked as rows ([G * Lq, D] per KV head), so no K/V is expanded per query head.
    """
    b, lq, h, d = q.shape
    kvh = k.shape[2]
    kt, vt = k.to(q.dtype).transpose(1, 2), v.to(q.dtype).transpose(1, 2)  # [B, KVH, Lk, D]
    if not softcap and sinks is None:
        # an additive mask: measured faster than a boolean one in SDPA on CPU (decode_attention.decode_mask)
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, float("-inf"))
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), kt, vt, attn_mask=mask.unsqueeze(1), scale=scale, enable_gqa=h != kvh
        )  # [B, H, Lq, D]
        return o.transpose(1, 2)
    g = h // kvh
    qg = q.view(b, lq, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * lq, d)
    scores = torch.matmul(qg, kt.transpose(-1, -2)) * scale  # [B, KVH, G * Lq, Lk]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.float().view(b, kvh, g, lq, -1).masked_fill(~keep[:, None, None], float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:  # [H] -> one more column per (KV head, group member), then dropped
        sink = sinks.float().view(1, kvh, g, 1, 1).expand(b, kvh, g, lq, 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    probs = probs.to(q.dtype).reshape(b, kvh, g * lq, -1)
    out = torch.matmul(probs, vt)  # [B, KVH, G * Lq, D]
    return out.view(b, kvh, g, lq, d).permute(0, 3, 1, 2, 4).reshape(b, lq, h, d)


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
    sinks: torch.Tensor | None = None,
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
        o = _attend(q.index_select(0, token_idx).unsqueeze(1), k, v, keep.unsqueeze(1), scale, softcap, sinks)
        out.index_copy_(0, token_idx, o[:, 0])


# Query tokens attended at once by the extend path: the scores of a block are [heads, QUERY_BLOCK, keys it sees], so
# a long prompt never builds an [n, n] mask (an 8k-token prompt's would be 256 MB a layer) and a windowed block reads
# only the keys its window reaches.
QUERY_BLOCK = 256


def _extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int,
    softcap: float,
    out: torch.Tensor,
    sinks: torch.Tensor | None = None,
) -> None:
    """Each extend sequence alone, QUERY_BLOCK new tokens at a time: over the visible part of its prefix and the new
    tokens up to the block's last, read from the cache."""
    page = k_cache.shape[1]
    for row, t0, p, n in zip(meta.extend_rows, meta.extend_token_starts, meta.extend_prefix_lens, meta.extend_lens):
        for j0 in range(0, n, QUERY_BLOCK):
            lo, hi = p + j0, p + min(n, j0 + QUERY_BLOCK)  # the block's query positions [lo, hi)
            first = max(0, lo - window + 1) // page if window else 0  # the page of its oldest visible key
            pages = meta.page_table[row, first : -(-hi // page)]
            k = k_cache.index_select(0, pages).flatten(0, 1)[: hi - first * page]  # [Lk, KVH, D]
            v = v_cache.index_select(0, pages).flatten(0, 1)[: hi - first * page]
            kpos = torch.arange(first * page, hi, device=q.device).unsqueeze(0)
            qpos = torch.arange(lo, hi, device=q.device).unsqueeze(1)
            keep = kpos <= qpos
            if window:
                keep &= kpos > qpos - window
            rows = slice(t0 + lo - p, t0 + hi - p)
            o = _attend(q[rows].unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), keep.unsqueeze(0), scale, softcap, sinks)
            out[rows] = o[0]


def needs_window_path(meta: AttentionMetadata, window: int, softcap: float, sinks: torch.Tensor | None = None) -> bool:
    """Whether a layer must take window_attention this step: soft-capped, with sinks, or windowed with some sequence
    longer than the window (a window covering every sequence changes nothing, and the backend's own kernels run)."""
    return bool(softcap) or sinks is not None or (window > 0 and meta.max_seq_len > window)


def window_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, heads, head_dim] -> [T, heads, head_dim] for every sequence of the step's plan (extend and decode),
    over K/V already written into k_cache, v_cache [num_pages, page_size, kv_heads, head_dim]; sinks: [heads]."""
    out = torch.empty_like(q)
    _extend(q, k_cache, v_cache, meta, scale, window, softcap, out, sinks)
    _decode(q, k_cache, v_cache, _decode_sets(meta, q.device), scale, window, softcap, out, sinks)
    return out
