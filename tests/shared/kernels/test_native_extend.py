"""The native (C) extend attention against the torch reference and naive attention: GQA groups, head sizes, page
sizes, prefixes on and off page boundaries, several sequences per call (rows of a mixed batch), one thread and
two; the backend's extend path on a model step; the sizes it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.kernels import dispatch
from shared.kernels.extend_attention import extend_attention
from shared.kernels.native import build
from shared.kernels.native.paged_extend import native_paged_extend
from tests.shared.kernels.paged_ref import naive_attention, page_table, scatter_to_pages

ok, why = build.native_available()
pytestmark = pytest.mark.skipif(not ok, reason=f"native kernels unavailable: {why}")


def _case(
    heads: int, kv_heads: int, d: int, page: int, prefix: list[int], ext: list[int], g: torch.Generator
) -> tuple[torch.Tensor, ...]:
    lens = [p + e for p, e in zip(prefix, ext, strict=True)]
    ks = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    vs = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, sum(-(-n // page) for n in lens) + 3, page, g)
    return ks, vs, k_cache, v_cache, page_table(pages, pad=int(pages[0][0]))  # type: ignore[return-value]


@pytest.mark.parametrize("heads,kv_heads,d", [(4, 4, 32), (9, 3, 64), (8, 2, 128), (16, 1, 64), (6, 3, 48), (2, 1, 20)])
@pytest.mark.parametrize("page", [1, 4, 16, 32])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_reference(heads: int, kv_heads: int, d: int, page: int, threads: int) -> None:
    """Several sequences in one call: no prefix, a prefix inside a page and across pages, one new token, new tokens
    not a multiple of the kernel's 16-token blocks."""
    g = torch.Generator().manual_seed(heads * 1000 + d + page)
    prefix, ext = [0, 7, 3 * page, 40], [37, 17, 1, 16]
    ks, vs, k_cache, v_cache, pt = _case(heads, kv_heads, d, page, prefix, ext, g)
    q = torch.randn(sum(ext), heads, d, generator=g)
    k_new = torch.cat([k[p:] for k, p in zip(ks, prefix, strict=True)])
    v_new = torch.cat([v[p:] for v, p in zip(vs, prefix, strict=True)])
    starts = np.cumsum([0, *ext[:-1]]).tolist()
    scale = d**-0.5
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.full_like(q, float("nan"))
        native_paged_extend(q, k_cache, v_cache, pt, starts, prefix, ext, scale, out)
    finally:
        torch.set_num_threads(before)
    ref = extend_attention(q, k_new, v_new, k_cache, v_cache, pt, prefix, ext, scale)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for i, (p, n) in enumerate(zip(prefix, ext, strict=True)):
        rows = slice(starts[i], starts[i] + n)
        exact = naive_attention(q[rows], ks[i], vs[i], torch.arange(p, p + n), scale)
        torch.testing.assert_close(out[rows].double(), exact, rtol=1e-5, atol=1e-5)


def test_backend_extend_rows_inside_a_mixed_batch() -> None:
    """The native backend's extend path: extend sequences at page-table rows 0 and 2 of a step whose row 1 is a decode
    token; their output rows match the reference's, and the decode row is filled by the decode kernel."""
    g = torch.Generator().manual_seed(5)
    page, heads, kvh, d = 4, 9, 3, 64
    prefix_lens = np.array([5, 9, 2], dtype=np.int64)
    extend_lens = np.array([6, 1, 11], dtype=np.int64)
    lens = (prefix_lens + extend_lens).tolist()
    ks = [torch.randn(n, kvh, d, generator=g) for n in lens]
    vs = [torch.randn(n, kvh, d, generator=g) for n in lens]
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 20, page, g)
    pt = page_table(pages)
    starts = dispatch.sequence_token_starts(extend_lens.tolist())
    q = torch.randn(int(extend_lens.sum()), heads, d, generator=g)
    k_new = torch.cat([k[p:] for k, p in zip(ks, prefix_lens.tolist(), strict=True)])
    v_new = torch.cat([v[p:] for v, p in zip(vs, prefix_lens.tolist(), strict=True)])
    native, ref = dispatch.NativeAttentionBackend(), dispatch.TorchAttentionBackend()
    outs = []
    for backend in (native, ref):
        meta = backend.prepare(pt, prefix_lens, extend_lens, starts, page)
        outs.append(backend.forward(q, k_new, v_new, k_cache, v_cache, meta, d**-0.5))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_refuses_head_dim_past_its_buffers() -> None:
    q = torch.randn(2, 2, 512)
    cache = torch.randn(2, 4, 1, 512)
    with pytest.raises(ValueError, match="--attention-backend torch"):
        native_paged_extend(q, cache, cache, torch.tensor([[0]]), [0], [0], [2], 1.0, torch.empty_like(q))
