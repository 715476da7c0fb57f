"""MLA attention over a paged latent cache: the weight-absorbed form (attention in the latent space through the
paged attention backend) against the reference (decompress every cached token through kv_b_proj), on random
numbers, for decode tokens and for extend chunks over cached prefixes in one step."""

from __future__ import annotations

import numpy as np
import torch

from shared.kernels.dispatch import TorchAttentionBackend
from shared.kernels.mla_attention import absorbed_weights, mla_attention, mla_attention_absorbed, plan_mla

H, NOPE, ROPE, V, RANK, PAGE = 5, 8, 4, 12, 16, 4


def test_absorbed_equals_reference_on_a_mixed_step() -> None:
    g = torch.Generator().manual_seed(0)
    num_pages = 40
    cache = torch.randn(num_pages, PAGE, 1, RANK + ROPE, generator=g)  # one layer's latent rows
    kv_b = torch.randn(H * (NOPE + V), RANK, generator=g) * 0.3
    prefix = np.array([9, 0, 5, 13], dtype=np.int64)  # cached tokens before this step
    extend = np.array([1, 7, 3, 1], dtype=np.int64)  # two decode tokens, two extend chunks (one with a prefix)
    starts = np.cumsum(extend) - extend
    perm = torch.randperm(num_pages, generator=g)
    table = torch.stack([perm[i * 5 : i * 5 + 5] for i in range(4)])  # [4, 5] scrambled page ids
    t = int(extend.sum())
    q_nope, q_pe = torch.randn(t, H, NOPE, generator=g), torch.randn(t, H, ROPE, generator=g)
    # the new tokens' rows, as the layer passes them (already in the cache)
    pos = np.concatenate([np.arange(p, p + n) for p, n in zip(prefix, extend)])
    seq = np.repeat(np.arange(4), extend)
    rows = cache[table[seq, pos // PAGE], torch.from_numpy(pos % PAGE)]  # [T, 1, RANK + ROPE]
    scale = 0.21
    ref = mla_attention(q_nope, q_pe, cache, plan_mla(table, prefix, extend, starts, PAGE), kv_b, RANK, V, scale)
    attn = TorchAttentionBackend()
    meta = attn.prepare(table, prefix, extend, starts, PAGE)
    w_uk, w_uv_t = absorbed_weights(kv_b, H, NOPE, V)
    got = mla_attention_absorbed(q_nope, q_pe, rows, cache, w_uk, w_uv_t, attn, meta, scale)
    assert got.shape == ref.shape == (t, H, V)
    assert (got - ref).abs().max().item() < 1e-5
    # and the reference itself against a dense computation of the first decode token (position 9, keys 0..9)
    keys = cache[table[0, torch.arange(10) // PAGE], torch.arange(10) % PAGE, 0]  # [10, RANK + ROPE]
    kv = (keys[:, :RANK] @ kv_b.T).view(10, H, NOPE + V)
    k = torch.cat((kv[..., :NOPE], keys[:, None, RANK:].expand(10, H, ROPE)), dim=-1)
    q = torch.cat((q_nope[0], q_pe[0]), dim=-1)  # [H, NOPE + ROPE]
    p = torch.softmax(torch.einsum("hd,lhd->hl", q, k) * scale, dim=-1)
    dense = torch.einsum("hl,lhv->hv", p, kv[..., NOPE:])
    assert (ref[0] - dense).abs().max().item() < 1e-5
