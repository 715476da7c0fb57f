"""The native (C) decode attention against the torch reference and naive attention: GQA groups, head sizes, page
sizes, lengths on and off page boundaries, strided pool views, decode rows inside a mixed batch; selection,
fallback without a compiler, and the sizes it refuses."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from shared.kernels import dispatch
from shared.kernels.decode_attention import paged_decode_attention
from shared.kernels.native import build, gemm
from shared.kernels.native.paged_decode import native_paged_decode
from tests.shared.kernels.paged_ref import naive_attention, page_table, scatter_to_pages

ok, why = build.native_available()
pytestmark = pytest.mark.skipif(not ok, reason=f"native kernels unavailable: {why}")


@pytest.mark.parametrize("heads,kv_heads,d", [(4, 4, 32), (9, 3, 64), (8, 2, 128), (16, 1, 64), (2, 1, 20)])
@pytest.mark.parametrize("page", [1, 4, 16, 32])
@pytest.mark.parametrize("threads,few", [(2, False), (2, True), (1, False)], ids=["per-seq", "per-head", "1-thread"])
def test_matches_reference(heads: int, kv_heads: int, d: int, page: int, threads: int, few: bool) -> None:
    """Every work split the kernel takes: a whole sequence per item (enough sequences for the threads), one kv head
    per item (fewer), one thread."""
    g = torch.Generator().manual_seed(heads * 1000 + d + page)
    lens = [3 * page + 1, 37] if few else [1, page, page + 1, 3 * page, 37, 2]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check(heads, kv_heads, d, page, lens, g)
    finally:
        torch.set_num_threads(before)


def _check(heads: int, kv_heads: int, d: int, page: int, lens: list[int], g: torch.Generator) -> None:
    ks = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    vs = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, sum(-(-n // page) for n in lens) + 5, page, g)
    pt = page_table(pages, pad=int(pages[0][0]))
    q = torch.randn(len(lens), heads, d, generator=g)
    seq_lens = torch.tensor(lens)
    scale = d**-0.5
    out = torch.full_like(q, float("nan"))
    native_paged_decode(q, k_cache, v_cache, pt, seq_lens, torch.arange(len(lens)), scale, out)
    ref = paged_decode_attention(q, k_cache, v_cache, pt, seq_lens, scale)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for i, n in enumerate(lens):
        exact = naive_attention(q[i : i + 1], ks[i], vs[i], torch.tensor([n - 1]), scale)
        torch.testing.assert_close(out[i : i + 1].double(), exact, rtol=1e-5, atol=1e-5)


def test_reads_pool_views_and_writes_only_its_rows() -> None:
    """k(layer)/v(layer) of the page-major pool are strided over layers; rows place each sequence's token."""
    g = torch.Generator().manual_seed(3)
    page, kvh, d, heads = 4, 3, 64, 9
    pool = torch.randn(12, 5, 2, page, kvh, d, generator=g)  # [pages, layers, K/V, page, kvh, d]
    k_cache, v_cache = pool[:, 2, 0], pool[:, 2, 1]
    pt = torch.tensor([[7, 1, 4], [0, 11, 0]])
    lens = torch.tensor([10, 6])
    q = torch.randn(5, heads, d, generator=g)  # a mixed batch: decode tokens at rows 4 and 1
    rows = torch.tensor([4, 1])
    out = torch.zeros_like(q)
    native_paged_decode(q, k_cache, v_cache, pt, lens, rows, 0.125, out)
    ref = paged_decode_attention(q[rows], k_cache, v_cache, pt, lens, 0.125)
    torch.testing.assert_close(out[rows], ref, rtol=1e-5, atol=1e-5)
    assert out[[0, 2, 3]].abs().sum() == 0  # other rows untouched


def test_refuses_sizes_past_its_buffers() -> None:
    q = torch.randn(1, 2, 512)
    cache = torch.randn(2, 4, 1, 512)
    with pytest.raises(ValueError, match="--attention-backend torch"):
        native_paged_decode(
            q, cache, cache, torch.tensor([[0]]), torch.tensor([3]), torch.tensor([0]), 1.0, torch.empty_like(q)
        )
    with pytest.raises(ValueError, match="fp32"):
        native_paged_decode(
            q.bfloat16(),
            cache.bfloat16(),
            cache.bfloat16(),
            torch.tensor([[0]]),
            torch.tensor([3]),
            torch.tensor([0]),
            1.0,
            torch.empty_like(q).bfloat16(),
        )


def test_backend_plans_decode_flat() -> None:
    backend = dispatch.select_attention_backend("native", "cpu")
    assert backend.name == "native"
    pt = torch.tensor([[3, 1, 0], [2, 0, 0], [5, 6, 0]])
    meta = backend.prepare(pt, np.array([8, 0, 5]), np.array([1, 4, 1]), np.array([0, 1, 5]), 4)
    assert meta.decode_groups == () and meta.extend_rows == (1,)
    flat = meta.flat_decode
    assert flat is not None
    assert flat.token_idx.tolist() == [0, 5] and flat.seq_lens.tolist() == [9, 6]
    assert flat.page_table.tolist() == [[3, 1, 0], [5, 6, 0]] and flat.page_table.is_contiguous()


def test_selection_and_fallback(monkeypatch, tmp_path, caplog) -> None:
    assert dispatch.select_attention_backend("auto", "cpu").name == "native"
    # bf16: native (fp32 q over a bf16 cache) where the CPU runs the bf16 kernels, the reference ops elsewhere
    bf16 = gemm.bf16_kernels()
    assert dispatch.select_attention_backend("auto", "cpu", torch.bfloat16).name == ("native" if bf16 else "torch")
    assert dispatch.select_attention_backend("native", "cpu", torch.bfloat16).dtype == torch.float32
    with pytest.raises(ValueError, match="fp32 or bf16 on cpu"):
        dispatch.select_attention_backend("native", "cpu", torch.float16)
    # no compiler: auto falls back to the reference ops and says why; an explicit 'native' is an error
    monkeypatch.setenv("PDRELAY_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "_compiler", lambda: None)
    build.load_library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert dispatch.select_attention_backend("auto", "cpu").name == "torch"
        assert "no C compiler" in caplog.text
        with pytest.raises(ValueError, match="unavailable: no C compiler"):
            dispatch.select_attention_backend("native", "cpu")
    finally:
        build.load_library.cache_clear()


def test_loading_keeps_subnormals() -> None:
    """A library linked with -ffast-math would turn on flush-to-zero for the whole process when it loads."""
    build.load_library()
    smallest_normal = 2.2250738585072014e-308
    assert smallest_normal / 4 > 0.0
    assert torch.tensor(1e-40, dtype=torch.float32).mul(1.0).item() > 0.0


def test_builds_once_into_the_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PDRELAY_KERNEL_CACHE", str(tmp_path))
    build.load_library.cache_clear()
    try:
        build.load_library()
        built = list(tmp_path.glob("pdrelay_kernels_*.so"))
        assert len(built) == 1
        stamp = built[0].stat().st_mtime_ns
        build.load_library.cache_clear()
        build.load_library()  # a second process: loads, does not rebuild
        assert built[0].stat().st_mtime_ns == stamp
    finally:
        build.load_library.cache_clear()
