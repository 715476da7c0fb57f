"""Multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache, torch reference (any device).

The cache holds, per token and layer, one latent row [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)]: c_kv the
RMS-normed compressed KV, k_pe the roped key shared by every head (an "mla" KVLayout, kv_pool.py). Here each
sequence's rows are gathered from its pages, decompressed (kv_b_proj: c_kv -> per head [k_nope | v]), k_pe is
appended to every head's k_nope, and the sequence's queries attend causally: the simple way, which recomputes every
cached token's keys and values at each step.

Weight absorption (`mla_attention_absorbed`) is the fast form of the same sums for decode steps: with
W_UK [H, nope, rank] and W_UV [H, v, rank] the two halves of kv_b_proj per head,
    q_nope . (W_UK c_kv) = (q_nope W_UK) . c_kv     and     sum_j p_j (W_UV c_kv_j) = W_UV (sum_j p_j c_kv_j),
so each query head is moved into the latent space once ([q_nope W_UK | q_pe], width rank + rope) and attends over the
cached rows as they are: multi-query attention with one KV "head" whose keys are the whole rows and whose values are
their c_kv part; the output comes back through W_UV. Nothing is decompressed per cached token, so a decode step reads
each sequence's latent rows once instead of recomputing every token's keys and values; the paged attention backend
runs it like any MQA. A prefill (many queries per sequence) stays on the reference, whose attention is narrower
(nope + rope instead of rank + rope), as SGLang and vLLM also do.

The plan (which cache slots hold each sequence's tokens) is made once per step and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from shared.kernels.attention_plan import AttentionMetadata
from shared.kernels.dispatch import AttentionBackend


@dataclass(frozen=True)
class MLAPlan:
    """One step's sequences: their query rows in the flat batch and the cache slots of all their tokens.

    seqs: per sequence (first query row, new tokens, cached tokens before them, first gathered key row); the keys
    of sequence i are gathered rows [key_start, key_start + cached + new), in position order.
    """

    seqs: tuple[tuple[int, int, int, int], ...]
    pages: torch.Tensor  # [K] int64: the page of each gathered key row (every sequence's, concatenated)
    offsets: torch.Tensor  # [K] int64: its slot in that page


def plan_mla(
    page_table: torch.Tensor, prefix_lens: np.ndarray, extend_lens: np.ndarray, token_starts: np.ndarray, page_size: int
) -> MLAPlan:
    """page_table [bs, max_pages] (on the device); prefix_lens, extend_lens, token_starts: [bs] int64 numpy."""
    lens = (prefix_lens + extend_lens).astype(np.int64)
    key_starts = np.cumsum(lens) - lens
    rows = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(key_starts, lens)  # each sequence's 0..len-1
    dev = page_table.device
    rows_t, pos_t = torch.from_numpy(rows).to(dev), torch.from_numpy(pos).to(dev)
    pages = page_table[rows_t, pos_t // page_size]
    seqs = tuple(
        (int(t), int(n), int(p), int(k)) for t, n, p, k in zip(token_starts, extend_lens, prefix_lens, key_starts)
    )
    return MLAPlan(seqs, pages, pos_t % page_size)


def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    plan: MLAPlan,
    kv_b_weight: torch.Tensor,
    kv_lora_rank: int,
    v_head_dim: int,
    scale: float,
) -> torch.Tensor:
    """q_nope [T, H, nope], q_pe [T, H, rope] (roped); cache [num_pages, page_size, 1, kv_lora_rank + rope] (one
    layer's latent rows, the step's already written); kv_b_weight [H * (nope + v), kv_lora_rank] -> [T, H, v]."""
    t, h, nope = q_nope.shape
    rope = q_pe.shape[-1]
    latent = cache[plan.pages, plan.offsets, 0].to(q_nope.dtype)  # [K, rank + rope]: widened if the pages are narrower
    kv = F.linear(latent[:, :kv_lora_rank], kv_b_weight).view(-1, h, nope + v_head_dim)  # [K, H, nope + v]
    k = torch.cat((kv[..., :nope], latent[:, None, kv_lora_rank:].expand(-1, h, rope)), dim=-1)  # [K, H, nope + rope]
    v = kv[..., nope:]
    q = torch.cat((q_nope, q_pe), dim=-1)  # [T, H, nope + rope]
    out = q.new_empty(t, h, v_head_dim)
    for start, n, cached, key_start in plan.seqs:
        length = cached + n
        qs = q[start : start + n].transpose(0, 1)  # [H, n, qk]
        ks = k[key_start : key_start + length].transpose(0, 1)  # [H, L, qk]
        vs = v[key_start : key_start + length].transpose(0, 1)  # [H, L, v]
        # query i (position cached + i) sees keys 0..cached + i
        keep = torch.arange(length, device=q.device)[None, :] <= torch.arange(cached, length, device=q.device)[:, None]
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=keep, scale=scale)  # [H, n, v]
        out[start : start + n] = o.transpose(0, 1)
    return out


def absorbed_weights(kv_b_weight: torch.Tensor, heads: int, nope: int, v_head_dim: int) -> tuple[torch.Tensor, ...]:
    """kv_b_proj [H * (nope + v), rank] -> (W_UK [H, nope, rank], W_UV^T [H, rank, v]), contiguous copies."""
    w = kv_b_weight.view(heads, nope + v_head_dim, -1)
    return w[:, :nope].contiguous(), w[:, nope:].transpose(1, 2).contiguous()


def mla_attention_absorbed(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    rows: torch.Tensor,
    cache: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv_t: torch.Tensor,
    attn: AttentionBackend,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """The same result as mla_attention, attending in the latent space: q_nope [T, H, nope], q_pe [T, H, rope];
    rows [T, 1, rank + rope] the new tokens' latent rows (already in `cache`, one layer's [num_pages, page_size, 1,
    rank + rope]); w_uk [H, nope, rank], w_uv_t [H, rank, v] (absorbed_weights) -> [T, H, v]."""
    rank = w_uk.shape[-1]
    q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, rank]
    q = torch.cat((q_lat, q_pe), dim=-1)  # [T, H, rank + rope]: one latent "key head" serves every query head
    # values are the rows too (their first `rank` columns are c_kv; the rope columns' output is dropped)
    o_lat = attn.forward(q, rows, rows, cache, cache, meta, scale)[..., :rank]  # [T, H, rank]
    return torch.bmm(o_lat.transpose(0, 1), w_uv_t).transpose(0, 1)  # [T, H, v]
