"""Multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache, torch reference (any device).

The cache holds, per token and layer, one latent row [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)]: c_kv the
RMS-normed compressed KV, k_pe the roped key shared by every head (an "mla" KVLayout, kv_pool.py). Here each
sequence's rows are gathered from its pages, decompressed (kv_b_proj: c_kv -> per head [k_nope | v]), k_pe is
appended to every head's k_nope, and the sequence's queries attend causally: the simple way, which recomputes every
cached token's keys and values at each step. Weight absorption (q_nope through W_UK, attention in the latent space,
the output through W_UV) is the fast form of the same sums; this one is the reference it is to be tested against.

The plan (which cache slots hold each sequence's tokens) is made once per step and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


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
