"""Sliding-window, soft-capped and sink attention (window_attention.py) against naive float64 attention over contiguous
keys, through each backend's plan of a step that mixes decode tokens and extend sequences (with cached prefixes):
the torch backend (decode in length groups), native (flat decode) and Triton's (every sequence as an extend on a
mixed step; one decode group on an all-decode step), whose windowed layers all take this path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.kernels import window_attention
from shared.kernels.dispatch import NativeAttentionBackend, TorchAttentionBackend, sequence_token_starts
from shared.kernels.native.build import native_available
from shared.kernels.window_attention import needs_window_path
from tests.shared.kernels.paged_ref import page_table, scatter_to_pages

HEADS, KV_HEADS, D, PAGE = 9, 3, 16, 4
SCALE = 0.3


def naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: int,
    window: int,
    softcap: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [H, D] at position pos over k, v [L, KVH, D] (positions 0..L-1) -> [H, D], float64; sinks [H]: one more
    softmax term per head with no value."""
    group = HEADS // KV_HEADS
    lo = max(0, pos - window + 1) if window else 0
    out = torch.empty(HEADS, D, dtype=torch.float64)
    for h in range(HEADS):
        kk, vv = k[lo : pos + 1, h // group].double(), v[lo : pos + 1, h // group].double()
        s = kk @ q[h].double() * SCALE
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        if sinks is not None:
            s = torch.cat((s, sinks[h : h + 1].double()))
            out[h] = torch.softmax(s, dim=0)[:-1] @ vv
            continue
        out[h] = torch.softmax(s, dim=0) @ vv
    return out


def _backends() -> list[object]:
    out: list[object] = [TorchAttentionBackend()]
    if native_available()[0]:
        out.append(NativeAttentionBackend())
    try:
        from shared.kernels.triton.backend import TritonAttentionBackend

        out.append(TritonAttentionBackend())
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("backend", _backends(), ids=lambda b: b.name)
# (40, 0): a window longer than every sequence, which the backends' own kernels take (needs_window_path)
# sinks (gpt-oss): with and without a window, alone and with soft-capping
@pytest.mark.parametrize(
    "window,softcap,with_sinks",
    [(5, 0.0, False), (0, 1.5, False), (7, 1.5, False), (1, 0.0, False), (40, 0.0, False)]
    + [(0, 0.0, True), (5, 0.0, True), (7, 1.5, True)],
)
@pytest.mark.parametrize("all_decode", [False, True])
@pytest.mark.parametrize("block", [256, 3], ids=["one-block", "query-blocks-of-3"])
def test_window_matches_naive(
    backend,
    window: int,
    softcap: float,
    with_sinks: bool,
    all_decode: bool,
    block: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(window_attention, "QUERY_BLOCK", block)  # blocks that start mid-page and mid-window
    g = torch.Generator().manual_seed(window * 10 + int(softcap) + all_decode)
    # (cached prefix, new tokens) per sequence: decode tokens far past the window and near its start, extends with
    # and without a prefix, one crossing several pages
    plan = [(30, 1), (3, 1), (17, 1)] if all_decode else [(30, 1), (0, 9), (3, 1), (6, 11), (0, 1), (13, 5)]
    lens = [p + n for p, n in plan]
    ks = [torch.randn(n, KV_HEADS, D, generator=g) for n in lens]
    vs = [torch.randn(n, KV_HEADS, D, generator=g) for n in lens]
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 64, PAGE, g)
    pt = page_table(pages, pad=int(pages[0][0]))
    prefix = np.array([p for p, _ in plan], dtype=np.int64)
    extend = np.array([n for _, n in plan], dtype=np.int64)
    starts = sequence_token_starts(extend)
    q = torch.randn(int(extend.sum()), HEADS, D, generator=g)
    meta = backend.prepare(pt, prefix, extend, starts, PAGE)
    sinks = torch.randn(HEADS, generator=g) * 2 if with_sinks else None
    assert needs_window_path(meta, window, softcap, sinks) == ((window, softcap, with_sinks) != (40, 0.0, False))
    k_new = torch.cat([k[p:] for k, (p, _) in zip(ks, plan)])  # the new tokens' K/V (the torch extend reads them)
    v_new = torch.cat([v[p:] for v, (p, _) in zip(vs, plan)])
    out = backend.forward(q, k_new, v_new, k_cache, v_cache, meta, SCALE, window, softcap, sinks)
    for i, (p, n) in enumerate(plan):
        for j in range(n):
            t = int(starts[i]) + j
            ref = naive(q[t], ks[i], vs[i], p + j, window, softcap, sinks)
            torch.testing.assert_close(out[t].double(), ref, rtol=1e-5, atol=1e-5)


def test_bf16_cache_with_fp32_queries() -> None:
    """The native bf16 path: fp32 q over a bf16 cache, widened as it is read."""
    g = torch.Generator().manual_seed(3)
    ks = [torch.randn(21, KV_HEADS, D, generator=g)]
    vs = [torch.randn(21, KV_HEADS, D, generator=g)]
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 16, PAGE, g)
    kb, vb = k_cache.bfloat16(), v_cache.bfloat16()
    backend = TorchAttentionBackend()
    meta = backend.prepare(page_table(pages), np.array([20]), np.array([1]), np.array([0]), PAGE)
    q = torch.randn(1, HEADS, D, generator=g)
    out = backend.forward(q, None, None, kb, vb, meta, SCALE, 6, 0.0)
    ref = naive(q[0], ks[0].bfloat16().float(), vs[0].bfloat16().float(), 20, 6, 0.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[0].double(), ref, rtol=1e-5, atol=1e-5)
