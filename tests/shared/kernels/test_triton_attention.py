"""Triton paged decode and extend attention, and the Triton attention backend, against the torch references and
naive float64 attention. On CPU the kernels run under Triton's interpreter (~0.3-1 s a call), so sizes are small
but cover: GQA, several key blocks per program, empty and non-empty splits, strided pool and q views, page tables
padded with real page ids, bf16/fp16. Inputs are fresh random each run (the seed is printed); outputs are
poisoned with NaN first. `gpu` tests repeat the checks compiled at real sizes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from shared.kernels.dispatch import TorchAttentionBackend, select_attention_backend, sequence_token_starts
from shared.kernels.triton import decode_attention as dec
from shared.kernels.triton import extend_attention as ext
from shared.kernels.triton.backend import TritonAttentionBackend, TritonAttentionMetadata
from tests.shared.kernels.paged_ref import naive_attention, page_table, scatter_to_pages

HEADS, KV_HEADS, D, PAGE = 6, 2, 16, 4  # GQA group of 3: padded to 16 rows inside the decode kernel
SCALE = D**-0.5


@pytest.fixture
def gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")  # pytest shows it when the test fails
    return torch.Generator().manual_seed(seed)


def kv_for(lens: list[int], g: torch.Generator, kvh: int = KV_HEADS, d: int = D):
    return ([torch.randn(n, kvh, d, generator=g) for n in lens], [torch.randn(n, kvh, d, generator=g) for n in lens])


def nans(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def strided_pool(k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Put k/v caches into layer `layer` of a page-major pool [pages, 3 layers, 2, page, kvh, d] and return its
    strided views, as KVPool.k(layer) / v(layer) do (other layers hold large garbage)."""
    pool = torch.randn(k_cache.shape[0], 3, 2, *k_cache.shape[1:]) * 100
    pool[:, layer, 0], pool[:, layer, 1] = k_cache, v_cache
    return pool[:, layer, 0], pool[:, layer, 1]


@pytest.mark.parametrize("lens,splits", [([5, 1, 70, 17], 1), ([5, 1, 70, 17], 3), ([1, 2], 4), ([40, 9], None)])
def test_decode_matches_reference_and_naive(gen: torch.Generator, lens: list[int], splits: int | None) -> None:
    ks, vs = kv_for(lens, gen)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 48, PAGE, gen)
    k_cache, v_cache = strided_pool(k_cache, v_cache)
    pt = page_table(pages, pad=pages[0][0])  # padding entries point at a real page full of other data
    seq_lens = torch.tensor(lens)
    qk = torch.randn(len(lens), HEADS + KV_HEADS, D, generator=gen)
    q = qk[:, :HEADS]  # strided, as the model hands it over
    out = nans(len(lens), HEADS, D)
    got = dec.paged_decode_attention(q, k_cache, v_cache, pt, seq_lens, SCALE, num_splits=splits, block_n=16, out=out)
    assert got is out and not out.isnan().any()
    ref = dec.reference(q, k_cache, v_cache, pt, seq_lens, SCALE)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for i, n in enumerate(lens):
        naive = naive_attention(q[i : i + 1], ks[i], vs[i], torch.tensor([n - 1]), SCALE)
        torch.testing.assert_close(out[i : i + 1].double(), naive, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_precision_tracks_naive(gen: torch.Generator, dtype: torch.dtype) -> None:
    lens = [23, 3]
    ks, vs = kv_for(lens, gen)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 16, PAGE, gen)
    q = torch.randn(2, HEADS, D, generator=gen).to(dtype)
    kc, vc = k_cache.to(dtype), v_cache.to(dtype)
    out = nans(2, HEADS, D, dtype=dtype)
    dec.paged_decode_attention(q, kc, vc, page_table(pages), torch.tensor(lens), SCALE, num_splits=2, out=out)
    assert out.dtype == dtype and not out.isnan().any()
    for i, n in enumerate(lens):
        # naive over the same rounded inputs: what is left is the output rounding (< 1 ulp of values ~1)
        naive = naive_attention(
            q[i : i + 1].float(), ks[i].to(dtype).float(), vs[i].to(dtype).float(), torch.tensor([n - 1]), SCALE
        )
        torch.testing.assert_close(out[i : i + 1].double(), naive, rtol=0, atol=1e-2)


def test_decode_rejects_mismatched_shapes() -> None:
    q = torch.randn(2, 5, D)  # 5 heads over 2 kv heads
    kc = torch.randn(4, PAGE, KV_HEADS, D)
    with pytest.raises(ValueError, match="not a multiple of kv_heads"):
        dec.paged_decode_attention(q, kc, kc, torch.zeros(2, 1, dtype=torch.int64), torch.ones(2), SCALE)
    with pytest.raises(ValueError, match="block_n"):
        dec.paged_decode_attention(
            torch.randn(2, 4, D),
            kc,
            kc,
            torch.zeros(2, 1, dtype=torch.int64),
            torch.ones(2, dtype=torch.int64),
            SCALE,
            block_n=24,
        )


def _extend_case(g: torch.Generator, prefix: list[int], new: list[int], dtype: torch.dtype = torch.float32):
    lens = [p + n for p, n in zip(prefix, new)]
    ks, vs = kv_for(lens, g)
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, 64, PAGE, g)
    q = torch.randn(sum(new), HEADS, D, generator=g).to(dtype)
    return ks, vs, k_cache.to(dtype), v_cache.to(dtype), pages, q


def test_extend_matches_reference_and_naive(gen: torch.Generator) -> None:
    # a prefill, a decode token, a long chunk after an unaligned prefix (two query blocks of 32), a short chunk
    prefix, new = [0, 9, 3, 13], [7, 1, 40, 5]
    ks, vs, k_cache, v_cache, pages, q = _extend_case(gen, prefix, new)
    k_cache, v_cache = strided_pool(k_cache, v_cache, layer=2)
    # the page table lists the sequences in another order than the tokens: rows say which row is whose
    order = [2, 0, 3, 1]
    pt = page_table([pages[i] for i in order], pad=pages[1][0])
    rows = torch.tensor([order.index(i) for i in range(4)])
    starts = sequence_token_starts(new)
    out = nans(sum(new), HEADS, D)
    ext.extend_attention(
        q,
        k_cache,
        v_cache,
        pt,
        rows,
        torch.from_numpy(starts),
        torch.tensor(prefix),
        torch.tensor(new),
        SCALE,
        max_extend_len=max(new),
        out=out,
    )
    assert not out.isnan().any()
    k_new = torch.cat([k[p:] for k, p in zip(ks, prefix)])
    v_new = torch.cat([v[p:] for v, p in zip(vs, prefix)])
    ref = ext.reference(q, k_new, v_new, k_cache, v_cache, pt, prefix, new, SCALE, rows=rows.tolist())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for i, (p, n) in enumerate(zip(prefix, new)):
        naive = naive_attention(q[starts[i] : starts[i] + n], ks[i], vs[i], torch.arange(p, p + n), SCALE)
        torch.testing.assert_close(out[starts[i] : starts[i] + n].double(), naive, rtol=1e-5, atol=1e-5)


def test_extend_leaves_rows_it_does_not_own(gen: torch.Generator) -> None:
    prefix, new = [5, 0], [3, 4]
    ks, vs, k_cache, v_cache, pages, q = _extend_case(gen, prefix, new)
    qq = torch.cat((q[:3], torch.randn(2, HEADS, D, generator=gen), q[3:]))  # two foreign rows at 3, 4
    out = nans(9, HEADS, D)
    ext.extend_attention(
        qq,
        k_cache,
        v_cache,
        page_table(pages),
        torch.tensor([0, 1]),
        torch.tensor([0, 5]),
        torch.tensor(prefix),
        torch.tensor(new),
        SCALE,
        max_extend_len=4,
        out=out,
    )
    assert out[3:5].isnan().all() and not out[:3].isnan().any() and not out[5:].isnan().any()
    naive = naive_attention(qq[5:], ks[1], vs[1], torch.arange(0, 4), SCALE)
    torch.testing.assert_close(out[5:].double(), naive, rtol=1e-5, atol=1e-5)


def test_extend_bf16_tracks_naive(gen: torch.Generator) -> None:
    prefix, new = [6, 0], [5, 9]
    ks, vs, k_cache, v_cache, pages, q = _extend_case(gen, prefix, new, torch.bfloat16)
    out = nans(14, HEADS, D, dtype=torch.bfloat16)
    ext.extend_attention(
        q,
        k_cache,
        v_cache,
        page_table(pages),
        torch.tensor([0, 1]),
        torch.tensor([0, 5]),
        torch.tensor(prefix),
        torch.tensor(new),
        SCALE,
        max_extend_len=9,
        out=out,
    )
    assert not out.isnan().any()
    t0 = 0
    for i, (p, n) in enumerate(zip(prefix, new)):
        naive = naive_attention(
            q[t0 : t0 + n].float(), ks[i].bfloat16().float(), vs[i].bfloat16().float(), torch.arange(p, p + n), SCALE
        )
        torch.testing.assert_close(out[t0 : t0 + n].double(), naive, rtol=0, atol=1e-2)
        t0 += n


def test_backend_is_selected_and_matches_torch_backend(gen: torch.Generator) -> None:
    backend = select_attention_backend("triton", "cpu")
    assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton"
    prefix, new = [6, 0, 9, 3], [1, 7, 1, 5]  # decode, prefill, decode, chunk: one extend launch
    ks, vs, k_cache, v_cache, pages, q = _extend_case(gen, prefix, new)
    k_new = torch.cat([k[p:] for k, p in zip(ks, prefix)])
    v_new = torch.cat([v[p:] for v, p in zip(vs, prefix)])
    pt, pre, n = page_table(pages), np.array(prefix), np.array(new)
    starts = sequence_token_starts(new)
    meta = backend.prepare(pt, pre, n, starts, PAGE)
    assert isinstance(meta, TritonAttentionMetadata) and not meta.all_decode and meta.max_extend_len == 7
    out = backend.forward(q, k_new, v_new, k_cache, v_cache, meta, SCALE)
    torch_backend = TorchAttentionBackend()
    ref = torch_backend.forward(
        q, k_new, v_new, k_cache, v_cache, torch_backend.prepare(pt, pre, n, starts, PAGE), SCALE
    )
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)

    # an all-decode step: one decode launch over the batch, planned without masks or groups
    one = np.ones(4, dtype=np.int64)
    lens = pre + n
    qd = torch.randn(4, HEADS, D, generator=gen)
    meta = backend.prepare(pt, lens - 1, one, sequence_token_starts(one), PAGE)
    assert meta.all_decode and meta.decode_groups[0].seq_lens.tolist() == lens.tolist()
    out = backend.forward(qd, qd[:, :KV_HEADS], qd[:, :KV_HEADS], k_cache, v_cache, meta, SCALE)
    for i, L in enumerate(lens.tolist()):
        naive = naive_attention(qd[i : i + 1], ks[i], vs[i], torch.tensor([L - 1]), SCALE)
        torch.testing.assert_close(out[i : i + 1].double(), naive, rtol=1e-5, atol=1e-5)


def test_backend_refuses_a_foreign_plan() -> None:
    pt = torch.zeros(2, 2, dtype=torch.int64)
    foreign = TorchAttentionBackend().prepare(pt, np.array([0, 3]), np.array([2, 1]), np.array([0, 2]), PAGE)
    q = torch.randn(3, HEADS, D)
    kc = torch.randn(2, PAGE, KV_HEADS, D)
    with pytest.raises(TypeError, match="TritonAttentionBackend.prepare"):
        TritonAttentionBackend().forward(q, q[:, :2], q[:, :2], kc, kc, foreign, SCALE)


# ---- compiled, at real sizes ------------------------------------------------------------------------------------
def _gpu_pool(g: torch.Generator, num_pages: int, page: int, kvh: int, d: int, dtype: torch.dtype):
    pool = torch.randn(num_pages, 2, 2, page, kvh, d, generator=g).to(dtype).cuda()  # 2 layers, page-major
    return pool[:, 1, 0], pool[:, 1, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kvh,d", [(9, 3, 64), (32, 8, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_decode_real_sizes(gen: torch.Generator, heads: int, kvh: int, d: int, dtype: torch.dtype) -> None:
    bs, page, ctx = 64, 16, 2048
    lens = torch.randint(1, ctx + 1, (bs,), generator=gen)
    lens[0] = ctx
    k_cache, v_cache = _gpu_pool(gen, bs * ctx // page + 8, page, kvh, d, dtype)
    pt = torch.randperm(k_cache.shape[0], generator=gen)[: bs * ctx // page].view(bs, ctx // page).cuda()
    q = torch.randn(bs, heads, d, generator=gen).to(dtype).cuda()
    out = nans(bs, heads, d, dtype=dtype, device="cuda")
    dec.paged_decode_attention(q, k_cache, v_cache, pt, lens.cuda(), d**-0.5, out=out)
    ref = dec.reference(q.float(), k_cache.float(), v_cache.float(), pt, lens.cuda(), d**-0.5)
    assert not out.isnan().any()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_extend_real_sizes(gen: torch.Generator, dtype: torch.dtype) -> None:
    heads, kvh, d, page = 32, 8, 128, 16
    prefix, new = [0, 1000, 37, 2048], [512, 300, 1, 129]
    lens = [p + n for p, n in zip(prefix, new)]
    max_pages = -(-max(lens) // page)
    k_cache, v_cache = _gpu_pool(gen, 4 * max_pages + 4, page, kvh, d, dtype)
    pt = torch.randperm(k_cache.shape[0], generator=gen)[: 4 * max_pages].view(4, max_pages).cuda()
    q = torch.randn(sum(new), heads, d, generator=gen).to(dtype).cuda()
    starts = sequence_token_starts(new)
    out = nans(sum(new), heads, d, dtype=dtype, device="cuda")
    ext.extend_attention(
        q,
        k_cache,
        v_cache,
        pt,
        torch.arange(4).cuda(),
        torch.from_numpy(starts).cuda(),
        torch.tensor(prefix).cuda(),
        torch.tensor(new).cuda(),
        d**-0.5,
        max_extend_len=512,
        out=out,
    )
    assert not out.isnan().any()
    # the reference takes the new tokens' K/V separately: read them back out of the cache
    k_new, v_new = [], []
    for i, (p, n) in enumerate(zip(prefix, new)):
        pos = torch.arange(p, p + n, device="cuda")
        pg = pt[i][pos // page]
        k_new.append(k_cache[pg, pos % page]), v_new.append(v_cache[pg, pos % page])
    ref = ext.reference(
        q.float(),
        torch.cat(k_new).float(),
        torch.cat(v_new).float(),
        k_cache.float(),
        v_cache.float(),
        pt,
        prefix,
        new,
        d**-0.5,
    )
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=tol)
