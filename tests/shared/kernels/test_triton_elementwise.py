"""Triton RMSNorm (plain, fused with the residual add, per-head weights), rotary embedding and SiLU-and-mul
against their torch references and naive float64 formulas; under Triton's interpreter on CPU, compiled at real
sizes in the `gpu` tests. Fresh random inputs each run (the seed is printed), outputs poisoned with NaN first."""

from __future__ import annotations

import os

import pytest
import torch

from shared.kernels.rotary import RotaryCache
from shared.kernels.triton import activation as act
from shared.kernels.triton import rms_norm as norm
from shared.kernels.triton import rotary as rot

HALF = (torch.bfloat16, torch.float16)


@pytest.fixture
def gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")
    return torch.Generator().manual_seed(seed)


def nans_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.full_like(x, float("nan"), dtype=dtype or x.dtype)


def naive_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps) * w.double()


def close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """fp32: to rounding; bf16/fp16: within one unit in the last place of the reference."""
    assert out.dtype == ref.dtype and out.shape == ref.shape and not out.isnan().any()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:
        ulp = 2.0 ** (-7 if out.dtype == torch.bfloat16 else -10)
        torch.testing.assert_close(out.float(), ref.float(), rtol=ulp, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("shape", [(1, 8), (7, 100), (3, 5, 32)])
def test_rms_norm(gen: torch.Generator, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype)
    out = nans_like(x)
    assert norm.rms_norm(x, w, 1e-6, out=out) is out
    close(out, norm.reference(x, w, 1e-6))
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), naive_rms(x, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_rms_norm_bf16_input_float32_weight(gen: torch.Generator) -> None:
    # the reference's type promotion: the normalised row is rounded to bf16, the product stays float32
    x = (torch.randn(4, 64, generator=gen) * 3).bfloat16()
    w = torch.randn(64, generator=gen)
    out = norm.rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, norm.reference(x, w, 1e-6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_per_head_weight_on_a_strided_view(gen: torch.Generator, dtype: torch.dtype) -> None:
    # Qwen3: q and k heads of the fused qkv projection, normalised in one call with a [heads, d] weight
    qkv = torch.randn(5, 8 * 16, generator=gen).to(dtype)
    x = qkv[:, : 6 * 16].view(5, 6, 16)
    w = torch.randn(6, 16, generator=gen).to(dtype)
    out = norm.rms_norm(x, w, 1e-6)
    close(out, norm.reference(x, w, 1e-6))
    with pytest.raises(ValueError, match="trailing dims"):
        norm.rms_norm(x, torch.randn(5, 16).to(dtype), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_fused_add_rms_norm(gen: torch.Generator, dtype: torch.dtype) -> None:
    x = (torch.randn(6, 96, generator=gen) * 2).to(dtype)
    res = torch.randn(6, 96, generator=gen).to(dtype)
    w = torch.randn(96, generator=gen).to(dtype)
    x0, res0 = x.clone(), res.clone()
    out, new_res = nans_like(x), nans_like(x)
    norm.fused_add_rms_norm(x, res, w, 1e-5, out=out, residual_out=new_res)
    assert torch.equal(x, x0) and torch.equal(res, res0)  # inputs untouched
    ref_out, ref_res = norm.fused_add_reference(x0, res0, w, 1e-5)
    assert torch.equal(new_res, ref_res)  # one rounded add: bit-exact
    close(out, ref_out)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_rotary(gen: torch.Generator, dtype: torch.dtype) -> None:
    heads, kvh, d = 6, 2, 32
    qkv = torch.randn(9, (heads + 2 * kvh) * d, generator=gen).to(dtype)
    x = qkv[:, : (heads + kvh) * d].view(9, heads + kvh, d)  # q and k heads, strided like the model's
    cache = RotaryCache(d, 128, 10000.0)
    cos, sin = cache.lookup(torch.randint(0, 128, (9,), generator=gen), dtype)
    out = torch.full((9, heads + kvh, d), float("nan"), dtype=dtype)
    assert rot.apply_rotary(x, cos, sin, out=out) is out
    check_rotary(out, x, cos, sin)


def check_rotary(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    dtype = x.dtype
    # naive float64 rotation of the same (rounded) inputs; the kernel rounds once, at the end
    x1, x2 = x.double().chunk(2, dim=-1)
    c, s = cos.double(), sin.double()
    naive = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    if dtype == torch.float32:
        close(out, rot.reference(x, cos, sin))
        torch.testing.assert_close(out.double(), naive, rtol=1e-5, atol=1e-5)
    else:
        ulp = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)
        assert not out.isnan().any()
        torch.testing.assert_close(out.double(), naive, rtol=ulp, atol=1e-5)
        # the reference rounds each product too, so near cancellation it is off by an ulp of the inputs
        ref = rot.reference(x, cos, sin).double()
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=2 * ulp * x.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("rows,inter", [(1, 4), (3, 1100)])  # 1100: two column programs per row
def test_silu_and_mul(gen: torch.Generator, dtype: torch.dtype, rows: int, inter: int) -> None:
    x = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(dtype)
    out = torch.full((rows, inter), float("nan"), dtype=dtype)
    assert act.silu_and_mul(x, out=out) is out
    close(out, act.reference(x))
    if dtype == torch.float32:
        g, u = x[:, :inter].double(), x[:, inter:].double()
        torch.testing.assert_close(out.double(), g / (1 + torch.exp(-g)) * u, rtol=1e-5, atol=1e-5)


def test_silu_and_mul_rejects_odd_width() -> None:
    with pytest.raises(ValueError, match="even last dimension"):
        act.silu_and_mul(torch.randn(2, 7))


# ---- compiled, at real sizes ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_elementwise_real_sizes(gen: torch.Generator, dtype: torch.dtype) -> None:
    t, hidden, inter, heads, kvh, d = 4096, 4096, 14336, 32, 8, 128
    x = torch.randn(t, hidden, generator=gen).to(dtype).cuda()
    res = torch.randn(t, hidden, generator=gen).to(dtype).cuda()
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).cuda()
    close(norm.rms_norm(x, w, 1e-6, out=nans_like(x)), norm.reference(x, w, 1e-6))
    out, new_res = norm.fused_add_rms_norm(x, res, w, 1e-6, out=nans_like(x), residual_out=nans_like(x))
    ref_out, ref_res = norm.fused_add_reference(x, res, w, 1e-6)
    close(out, ref_out)
    assert torch.equal(new_res, ref_res)
    qk = torch.randn(t, heads + kvh, d, generator=gen).to(dtype).cuda()
    cos, sin = RotaryCache(d, 8192, 500000.0, device="cuda").lookup(torch.randint(0, 8192, (t,)).cuda(), dtype)
    check_rotary(rot.apply_rotary(qk, cos, sin, out=nans_like(qk)), qk, cos, sin)
    gu = torch.randn(t, 2 * inter, generator=gen).to(dtype).cuda()
    close(act.silu_and_mul(gu, out=torch.full((t, inter), float("nan"), dtype=dtype, device="cuda")), act.reference(gu))
