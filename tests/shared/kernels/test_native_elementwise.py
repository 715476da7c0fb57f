"""The native elementwise ops (shared/kernels/native/elementwise.c) against the torch references: add + RMSNorm and
SiLU-and-mul on strided and contiguous rows, one row to a prefill chunk (the threaded path); rope_store's q, k and
cache slots against apply_rotary + KVPool-style index_put_, padding slots stored nowhere, a slot outside the cache
refused before anything is written; the `native` op set is what the native attention backend gets."""

from __future__ import annotations

import pytest
import torch

from shared.kernels import activation, rms_norm, rotary
from shared.kernels.elementwise import elementwise_ops
from shared.kernels.native.build import native_available

pytestmark = pytest.mark.skipif(not native_available()[0], reason=f"native kernels: {native_available()[1]}")

if native_available()[0]:
    from shared.kernels.native import elementwise as ne

TOL = {"atol": 2e-6, "rtol": 2e-6}


@pytest.mark.parametrize("rows", [0, 1, 16, 300])
@pytest.mark.parametrize("strided", [False, True])
def test_add_rms_norm_matches_reference(rows: int, strided: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    d = 576
    wide = torch.randn(rows, 2 * d, generator=g) * 3
    x = wide[:, :d] if strided else wide[:, :d].contiguous()  # a slice of a wider output, as the model passes
    res = torch.randn(rows, d, generator=g)
    w = torch.randn(d, generator=g)
    x0, res0 = x.clone(), res.clone()
    normed, new_res = ne.fused_add_rms_norm(x, res, w, 1e-5)
    ref_normed, ref_res = rms_norm.fused_add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(new_res, ref_res, atol=0, rtol=0)
    torch.testing.assert_close(normed, ref_normed, **TOL)
    assert torch.equal(x, x0) and torch.equal(res, res0), "inputs are left unchanged"


@pytest.mark.parametrize("rows", [1, 16, 200])
def test_silu_and_mul_matches_reference(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * 1536, generator=g) * 4
    x[0, :4] = torch.tensor([-200.0, -88.5, 90.0, 0.0])  # exp's argument past fp32's range either way
    torch.testing.assert_close(ne.silu_and_mul(x), activation.silu_and_mul(x), **TOL)


def _caches(pages: int, page_size: int, kv_heads: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    # one layer's views of a pool laid out like KVPool's: [layers, pages, page_size, kv_heads, d] per K and V
    pool = torch.full((2, 3, pages, page_size, kv_heads, d), float("nan"))
    return pool[0, 1], pool[1, 1]


@pytest.mark.parametrize(("heads", "kv_heads", "d"), [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
@pytest.mark.parametrize("rows", [1, 16, 130])
def test_rope_store_matches_rotary_and_the_pool_write(heads: int, kv_heads: int, d: int, rows: int) -> None:
    g = torch.Generator().manual_seed(heads * rows + d)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=g)
    ang = torch.rand(rows, 1, d // 2, generator=g) * 100
    cos, sin = ang.cos(), ang.sin()
    pages, page_size = 64, 16
    slots = torch.randperm(pages * page_size, generator=g)[:rows]
    out_pages, out_offsets = slots // page_size, slots % page_size
    k_cache, v_cache = _caches(pages, page_size, kv_heads, d)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()

    q, k = ne.rope_store(qkv, heads, kv_heads, d, cos, sin, k_cache, v_cache, out_pages, out_offsets)

    qk = rotary.apply_rotary(qkv[:, : (heads + kv_heads) * d].view(rows, heads + kv_heads, d), cos, sin)
    v = qkv[:, (heads + kv_heads) * d :].view(rows, kv_heads, d)
    ref_k.index_put_((out_pages, out_offsets), qk[:, heads:])
    ref_v.index_put_((out_pages, out_offsets), v)
    assert q.is_contiguous() and k.is_contiguous()
    torch.testing.assert_close(q, qk[:, :heads], **TOL)
    torch.testing.assert_close(k, qk[:, heads:], **TOL)
    torch.testing.assert_close(k_cache, ref_k, equal_nan=True, **TOL)  # NaN: every other slot untouched
    torch.testing.assert_close(v_cache, ref_v, equal_nan=True, atol=0, rtol=0)


def test_rope_store_skips_padding_and_refuses_slots_outside_the_cache() -> None:
    heads, kv_heads, d = 2, 1, 16
    qkv = torch.randn(2, (heads + 2 * kv_heads) * d)
    cos, sin = torch.ones(2, 1, d // 2), torch.zeros(2, 1, d // 2)
    k_cache, v_cache = _caches(4, 8, kv_heads, d)
    pages, offsets = torch.tensor([-1, 3]), torch.tensor([0, 7])
    ne.rope_store(qkv, heads, kv_heads, d, cos, sin, k_cache, v_cache, pages, offsets)
    assert torch.isnan(k_cache[:3]).all() and torch.isnan(k_cache[3, :7]).all(), "a padding row is stored nowhere"
    torch.testing.assert_close(v_cache[3, 7], qkv[1, (heads + kv_heads) * d :].view(kv_heads, d), atol=0, rtol=0)
    before = k_cache.clone()
    for bad_pages, bad_offsets in ((torch.tensor([0, 4]), offsets), (torch.tensor([0, 3]), torch.tensor([0, 8]))):
        with pytest.raises(IndexError, match="outside the cache of 4 x 8"):
            ne.rope_store(qkv, heads, kv_heads, d, cos, sin, k_cache, v_cache, bad_pages, bad_offsets)
    torch.testing.assert_close(k_cache, before, equal_nan=True, atol=0, rtol=0)


def test_native_attention_gets_the_native_ops() -> None:
    ops = elementwise_ops("native")
    assert ops.name == "native" and ops.rope_store is ne.rope_store
    assert ops.fused_add_rms_norm is ne.fused_add_rms_norm and ops.silu_and_mul is ne.silu_and_mul
    assert elementwise_ops("torch").rope_store is None


def test_non_fp32_input_is_refused() -> None:
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp32 CPU"):
        ne.silu_and_mul(x)
