"""The native bf16 kernels (where the CPU has avx512_bf16) against torch references: the few-row GEMM over bf16
panels (fp32 x rounded to bf16 as transformers' bf16 model holds it, fp32 sums) at every register-tile row count and
off-panel column counts, its gated form, decode and extend attention over a bf16 cache (each element widened, so the
fp32 reference over the same bf16 values is matched to fp32 rounding), and the K/V store rounding exactly as torch's
.to(bfloat16) does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from shared.kernels import rotary
from shared.kernels.decode_attention import paged_decode_attention
from shared.kernels.extend_attention import extend_attention
from shared.kernels.linear import NativeLinear, OneDnnLinear, TorchLinear, onednn_available, select_linear_backend
from shared.kernels.native import build, gemm
from shared.kernels.native import elementwise as ne
from shared.kernels.native.paged_decode import native_paged_decode
from shared.kernels.native.paged_extend import native_paged_extend
from tests.shared.kernels.paged_ref import page_table, scatter_to_pages

ok, why = build.native_available()
pytestmark = [
    pytest.mark.skipif(not ok, reason=f"native kernels unavailable: {why}"),
    pytest.mark.skipif(ok and not gemm.bf16_kernels(), reason="this CPU has no avx512_bf16"),
]
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """float64 GEMM of x rounded to bf16 (the kernel's operand) and the bf16 weight."""
    return F.linear(x.bfloat16().double(), w.double(), b.double() if b is not None else None)


@pytest.mark.parametrize("rows", [0, 1, 7, 8, 9, 16, 17, 24])
@pytest.mark.parametrize(("out_features", "in_features"), [(96, 80), (37, 300), (16, 514), (20, 64), (64, 700)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_matches_float64_reference(rows: int, out_features: int, in_features: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    w = (torch.randn(out_features, in_features, generator=g) * 0.1).bfloat16()
    b = torch.randn(out_features, generator=g) if with_bias else None
    x = torch.randn(rows, in_features, generator=g)
    kernel = NativeLinear(TorchLinear())
    packed = kernel.pack(w)
    assert packed.panels.dtype == torch.bfloat16 and packed.shape == (out_features, in_features)  # type: ignore[union-attr]
    out = kernel.apply(x, packed, b)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    if rows:  # products exact, fp32 sums blocked: fp32 rounding of sums over k
        assert (out.double() - _ref(x, w, b)).abs().max().item() < 1e-5 * in_features**0.5


def test_odd_inner_size_and_strided_rows() -> None:
    g = torch.Generator().manual_seed(4)
    w = torch.randn(40, 33, generator=g).bfloat16()
    x = torch.randn(5, 50, generator=g)[:, 3:36]  # each row contiguous, rows 50 apart
    out = gemm.native_gemm(x, gemm.pack_panels(w), 40, None)
    assert (out.double() - _ref(x, w, None)).abs().max().item() < 1e-4


@pytest.mark.parametrize("rows", [1, 5, 16, 24])
@pytest.mark.parametrize("inter", [40, 1536])
def test_gated_equals_gemm_then_silu_mul(rows: int, inter: int) -> None:
    g = torch.Generator().manual_seed(rows + inter)
    w = (torch.randn(2 * inter, 96, generator=g) * 0.1).bfloat16()
    x = torch.randn(rows, 96, generator=g)
    kernel = NativeLinear(TorchLinear())
    fused = kernel.apply_gated(x, kernel.pack_gated(w))
    assert fused is not None
    assert torch.equal(fused, ne.silu_and_mul(kernel.apply(x, kernel.pack(w))))  # the same sums, the same formula


def test_wide_steps_cast_x_to_the_weights_dtype() -> None:
    """Past the row limit the wrapped backend runs bf16 (oneDNN's bf16 GEMM, or F.linear): fp32 x in, fp32 out."""
    g = torch.Generator().manual_seed(6)
    w, x = torch.randn(48, 64, generator=g).bfloat16(), torch.randn(40, 64, generator=g)
    for wide in (TorchLinear(), *((OneDnnLinear(),) if onednn_available() else ())):
        kernel = NativeLinear(wide, max_rows=24)
        out = kernel.apply(x, kernel.pack(w))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, F.linear(x.bfloat16(), w).float(), rtol=0, atol=0)
    assert select_linear_backend("auto", "cpu", torch.bfloat16).name == "native"


@pytest.mark.parametrize("heads,kv_heads,d", [(4, 4, 32), (9, 3, 64), (8, 2, 128), (2, 1, 20)])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("threads,few", [(2, False), (2, True), (1, False)], ids=["per-seq", "per-head", "1-thread"])
def test_decode_attention_over_a_bf16_cache(heads: int, kv_heads: int, d: int, page: int, threads: int, few: bool):
    g = torch.Generator().manual_seed(heads * 100 + d + page)
    lens = [3 * page + 1, 37] if few else [1, page, page + 1, 3 * page, 37, 2]
    ks = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    vs = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, sum(-(-n // page) for n in lens) + 5, page, g)
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    pt = page_table(pages, pad=int(pages[0][0]))
    q = torch.randn(len(lens), heads, d, generator=g)
    seq_lens = torch.tensor(lens)
    out = torch.full_like(q, float("nan"))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        native_paged_decode(q, k_cache, v_cache, pt, seq_lens, torch.arange(len(lens)), d**-0.5, out)
    finally:
        torch.set_num_threads(before)
    ref = paged_decode_attention(q, k_cache.float(), v_cache.float(), pt, seq_lens, d**-0.5)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 2, 128), (2, 1, 20)])
@pytest.mark.parametrize("page", [4, 16])
def test_extend_attention_over_a_bf16_cache(heads: int, kv_heads: int, d: int, page: int) -> None:
    g = torch.Generator().manual_seed(heads * 10 + d + page)
    prefix, ext = [0, 7, 3 * page, 40], [37, 17, 1, 16]
    lens = [p + e for p, e in zip(prefix, ext, strict=True)]
    ks = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    vs = [torch.randn(n, kv_heads, d, generator=g) for n in lens]
    k_cache, v_cache, pages = scatter_to_pages(ks, vs, sum(-(-n // page) for n in lens) + 3, page, g)
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    pt = page_table(pages, pad=int(pages[0][0]))
    q = torch.randn(sum(ext), heads, d, generator=g)
    starts = np.cumsum([0, *ext[:-1]]).tolist()
    out = torch.full_like(q, float("nan"))
    native_paged_extend(q, k_cache, v_cache, pt, starts, prefix, ext, d**-0.5, out)
    kf, vf = k_cache.float(), v_cache.float()
    k_new = torch.cat([k.bfloat16().float()[p:] for k, p in zip(ks, prefix, strict=True)])
    v_new = torch.cat([v.bfloat16().float()[p:] for v, p in zip(vs, prefix, strict=True)])
    ref = extend_attention(q, k_new, v_new, kf, vf, pt, prefix, ext, d**-0.5)
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("rows", [1, 16, 130])
def test_rope_store_rounds_into_a_bf16_cache_as_torch_does(rows: int) -> None:
    heads, kv_heads, d = 9, 3, 64
    g = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=g)
    ang = torch.rand(rows, 1, d // 2, generator=g) * 100
    cos, sin = ang.cos(), ang.sin()
    pages, page_size = 64, 16
    slots = torch.randperm(pages * page_size, generator=g)[:rows]
    out_pages, out_offsets = slots // page_size, slots % page_size
    pool = torch.full((2, 3, pages, page_size, kv_heads, d), 7.0, dtype=torch.bfloat16)
    k_cache, v_cache = pool[0, 1], pool[1, 1]
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    q, k = ne.rope_store(qkv, heads, kv_heads, d, cos, sin, k_cache, v_cache, out_pages, out_offsets)
    assert q.dtype == k.dtype == torch.float32
    qk = rotary.apply_rotary(qkv[:, : (heads + kv_heads) * d].view(rows, heads + kv_heads, d), cos, sin)
    torch.testing.assert_close(k, qk[:, heads:], **TOL)
    # the cache holds the kernel's own fp32 k and the v columns, rounded to nearest even: torch's rounding, bit for bit
    ref_k.index_put_((out_pages, out_offsets), k.bfloat16())
    ref_v.index_put_((out_pages, out_offsets), qkv[:, (heads + kv_heads) * d :].view(rows, kv_heads, d).bfloat16())
    assert torch.equal(k_cache.view(torch.int16), ref_k.view(torch.int16))
    assert torch.equal(v_cache.view(torch.int16), ref_v.view(torch.int16))
