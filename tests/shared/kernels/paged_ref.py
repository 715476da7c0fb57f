"""Test helpers: scatter contiguous per-sequence K/V into a paged cache at random pages, and naive attention."""

from __future__ import annotations

import torch


def scatter_to_pages(
    ks: list[torch.Tensor], vs: list[torch.Tensor], num_pages: int, page_size: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """ks[i], vs[i]: [len_i, kv_heads, d] -> (k_cache, v_cache [num_pages, page_size, kv_heads, d], pages per seq).

    Pages are drawn in random order; unused pages and slots hold large finite garbage, so reading a wrong slot
    shows up in the result instead of hiding behind zeros.
    """
    kvh, d = ks[0].shape[1:]
    k_cache = torch.randn(num_pages, page_size, kvh, d, generator=g) * 100
    v_cache = torch.randn(num_pages, page_size, kvh, d, generator=g) * 100
    order = torch.randperm(num_pages, generator=g).tolist()
    pages: list[list[int]] = []
    for k, v in zip(ks, vs):
        n = -(-k.shape[0] // page_size)
        mine, order = order[:n], order[n:]
        assert len(mine) == n, "not enough pages for the test"
        for j, p in enumerate(mine):
            rows = slice(j * page_size, (j + 1) * page_size)
            k_cache[p, : k[rows].shape[0]] = k[rows]
            v_cache[p, : v[rows].shape[0]] = v[rows]
        pages.append(mine)
    return k_cache, v_cache, pages


def page_table(pages: list[list[int]], pad: int = 0) -> torch.Tensor:
    width = max(len(p) for p in pages)
    return torch.tensor([p + [pad] * (width - len(p)) for p in pages], dtype=torch.int64)


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [n, H, d] at positions q_pos [n]; k, v [L, KVH, d] for positions 0..L-1; causal; float64. -> [n, H, d]."""
    heads, kvh = q.shape[1], k.shape[1]
    group = heads // kvh
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        for h in range(heads):
            kk = k[: int(q_pos[i]) + 1, h // group].double()
            vv = v[: int(q_pos[i]) + 1, h // group].double()
            w = torch.softmax(kk @ q[i, h].double() * scale, dim=0)
            out[i, h] = w @ vv
    return out
