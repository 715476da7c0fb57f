"""Paged decode attention, extend attention over a cached prefix, and the backend that mixes them, each against
naive float64 attention over contiguous keys/values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.kernels.attention_plan import length_groups
from shared.kernels.decode_attention import GatherWorkspace, decode_mask, paged_decode_attention
from shared.kernels.dispatch import TorchAttentionBackend, select_attention_backend, sequence_token_starts
from shared.kernels.extend_attention import extend_attention
from tests.shared.kernels.paged_ref import naive_attention, page_table, scatter_to_pages

HEADS, KV_HEADS, D, PAGE = 8, 2, 16, 4
SCALE = D**-0.5


def _kv(lens: list[int], g: torch.Generator) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return (
        [torch.randn(n, KV_HEADS, D, generator=g) for n in lens],
        [torch.randn(n, KV_HEADS, D, generator=g) for n in lens],
    )


@pytest.mark.parametrize("lens", [[1], [5, 1, 17, 8], [33, 2]])
@pytest.mark.parametrize("use_workspace", [False, True])
def test_paged_decode_matches_naive(lens: list[int], use_workspace: bool) -> None:
    g = torch.Generator().manual_seed(len(lens) * 100 + sum(lens))
    ks, vs = _kv(lens, g)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 40, PAGE, g)
    q = torch.randn(len(lens), HEADS, D, generator=g)
    pt = page_table(pages, pad=int(pages[0][0]))  # padding points at a real page full of other data
    seq_lens = torch.tensor(lens)
    ws = GatherWorkspace() if use_workspace else None
    out = paged_decode_attention(q, k_cache, v_cache, pt, seq_lens, SCALE, workspace=ws)
    assert out.shape == q.shape and not out.isnan().any()
    for i, n in enumerate(lens):
        ref = naive_attention(q[i : i + 1], ks[i], vs[i], torch.tensor([n - 1]), SCALE)
        torch.testing.assert_close(out[i : i + 1].double(), ref, rtol=1e-5, atol=1e-5)
    if ws is not None:  # a second, smaller call reuses the buffers and is still right
        out2 = paged_decode_attention(
            q[:1],
            k_cache,
            v_cache,
            pt[:1],
            seq_lens[:1],
            SCALE,
            workspace=ws,
            mask=decode_mask(seq_lens[:1], pt.shape[1] * PAGE),
        )
        torch.testing.assert_close(out2, out[:1])


def test_paged_decode_reads_strided_pool_views() -> None:
    # the pool hands out k(layer) views strided over layers; the kernel must read them, not assume contiguity
    g = torch.Generator().manual_seed(7)
    pool = torch.randn(6, 3, 2, PAGE, KV_HEADS, D, generator=g)  # [pages, layers, K/V, page, kvh, d]
    k_cache, v_cache = pool[:, 1, 0], pool[:, 1, 1]
    pt = torch.tensor([[4, 2], [0, 5]])
    q = torch.randn(2, HEADS, D, generator=g)
    out = paged_decode_attention(q, k_cache, v_cache, pt, torch.tensor([6, 8]), SCALE, workspace=GatherWorkspace())
    for i, n in enumerate([6, 8]):
        k = torch.cat([k_cache[p] for p in pt[i].tolist()])[:n]
        v = torch.cat([v_cache[p] for p in pt[i].tolist()])[:n]
        ref = naive_attention(q[i : i + 1], k, v, torch.tensor([n - 1]), SCALE)
        torch.testing.assert_close(out[i : i + 1].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix_lens,extend_lens", [([0], [9]), ([0, 5, 8, 3], [7, 1, 9, 4]), ([12], [1])])
def test_extend_attention_matches_naive(prefix_lens: list[int], extend_lens: list[int]) -> None:
    g = torch.Generator().manual_seed(sum(prefix_lens) * 31 + sum(extend_lens))
    lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
    ks, vs = _kv(lens, g)
    # the cache holds the whole sequence (prefix + new tokens are written before attention)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 64, PAGE, g)
    q = torch.randn(sum(extend_lens), HEADS, D, generator=g)
    k_new = torch.cat([k[p:] for k, p in zip(ks, prefix_lens)])
    v_new = torch.cat([v[p:] for v, p in zip(vs, prefix_lens)])
    out = extend_attention(q, k_new, v_new, k_cache, v_cache, page_table(pages), prefix_lens, extend_lens, SCALE)
    assert out.shape == q.shape and not out.isnan().any()
    t0 = 0
    for i, (p, n) in enumerate(zip(prefix_lens, extend_lens)):
        ref = naive_attention(q[t0 : t0 + n], ks[i], vs[i], torch.arange(p, p + n), SCALE)
        torch.testing.assert_close(out[t0 : t0 + n].double(), ref, rtol=1e-5, atol=1e-5)
        t0 += n


def test_backend_mixes_decode_and_extend_in_one_step() -> None:
    g = torch.Generator().manual_seed(11)
    prefix_lens, extend_lens = [6, 0, 9, 3, 13], [1, 7, 1, 5, 1]  # decode, prefill, decode, chunk, decode
    lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
    ks, vs = _kv(lens, g)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 64, PAGE, g)
    q = torch.randn(sum(extend_lens), HEADS, D, generator=g)
    k_new = torch.cat([k[p:] for k, p in zip(ks, prefix_lens)])
    v_new = torch.cat([v[p:] for v, p in zip(vs, prefix_lens)])
    backend = select_attention_backend("auto", "cpu")
    assert isinstance(backend, TorchAttentionBackend)
    pre, ext = np.array(prefix_lens), np.array(extend_lens)
    meta = backend.prepare(page_table(pages), pre, ext, sequence_token_starts(extend_lens), PAGE)
    assert not meta.all_decode and meta.extend_rows == (1, 3)
    out = backend.forward(q, k_new, v_new, k_cache, v_cache, meta, SCALE)
    assert not out.isnan().any()
    t0 = 0
    for i, (p, n) in enumerate(zip(prefix_lens, extend_lens)):
        ref = naive_attention(q[t0 : t0 + n], ks[i], vs[i], torch.arange(p, p + n), SCALE)
        torch.testing.assert_close(out[t0 : t0 + n].double(), ref, rtol=1e-5, atol=1e-5)
        t0 += n


def test_backend_all_decode_plan() -> None:
    backend = TorchAttentionBackend()
    pt = torch.tensor([[3, 1, 0], [2, 0, 0]])
    meta = backend.prepare(pt, np.array([8, 5]), np.array([1, 1]), np.array([0, 1]), PAGE)
    assert meta.all_decode and meta.extend_rows == ()
    (g,) = meta.decode_groups
    assert g.token_idx is None and g.page_table.shape == (2, 3)  # 9 tokens -> 3 pages
    assert g.seq_lens.tolist() == [9, 6] and g.mask.shape == (2, 1, 1, 12)


def test_length_groups_bound_padding() -> None:
    pages = np.array([3, 40, 2, 38, 12, 20, 1])
    groups = length_groups(pages)
    assert sorted(np.concatenate(groups).tolist()) == list(range(7))  # a partition
    for g in groups:
        assert pages[g].max() < 2 * pages[g].min()  # no group pads any member to 2x its length
    assert [sorted(pages[g].tolist()) for g in groups] == [[38, 40], [12, 20], [2, 3], [1]]
    halving = np.array([2, 64, 4, 32, 8, 16])
    assert [sorted(halving[g].tolist()) for g in length_groups(halving)] == [[64], [32], [16], [2, 4, 8]]  # cap 4
    assert len(length_groups(np.array([5, 5, 4]))) == 1


def test_decode_groups_of_very_different_lengths_match_naive() -> None:
    g = torch.Generator().manual_seed(17)
    lens = [3, 61, 5, 30, 2, 64, 9]  # several length groups, interleaved in the batch
    ks, vs = _kv(lens, g)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 96, PAGE, g)
    q = torch.randn(len(lens), HEADS, D, generator=g)
    backend = TorchAttentionBackend()
    one = np.ones(len(lens), dtype=np.int64)
    meta = backend.prepare(page_table(pages), np.array(lens) - 1, one, sequence_token_starts(one), PAGE)
    assert len(meta.decode_groups) > 1 and not meta.all_decode
    out = backend.forward(q, q[:, :KV_HEADS], q[:, :KV_HEADS], k_cache, v_cache, meta, SCALE)
    assert not out.isnan().any()
    for i, n in enumerate(lens):
        ref = naive_attention(q[i : i + 1], ks[i], vs[i], torch.tensor([n - 1]), SCALE)
        torch.testing.assert_close(out[i : i + 1].double(), ref, rtol=1e-5, atol=1e-5)


def test_backend_choice_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="use --attention-backend torch"):
        select_attention_backend("triton", "meta")
    with pytest.raises(ValueError, match="flash"):
        select_attention_backend("flash", "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_decode_half_precision_tracks_float32(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(13)
    lens = [7, 19, 2]
    ks, vs = _kv(lens, g)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 32, PAGE, g)
    q = torch.randn(len(lens), HEADS, D, generator=g)
    pt, seq_lens = page_table(pages), torch.tensor(lens)
    ref = paged_decode_attention(q, k_cache, v_cache, pt, seq_lens, SCALE)
    out = paged_decode_attention(
        q.to(dtype),
        k_cache.to(dtype),
        v_cache.to(dtype),
        pt,
        seq_lens,
        SCALE,
        mask=decode_mask(seq_lens, pt.shape[1] * PAGE, dtype),
        workspace=GatherWorkspace(),
    )
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=3e-2)
