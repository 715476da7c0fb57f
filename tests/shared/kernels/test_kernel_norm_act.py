"""rms_norm, fused_add_rms_norm and silu_and_mul against naive float64 formulas."""

from __future__ import annotations

import pytest
import torch

from shared.kernels.activation import silu_and_mul
from shared.kernels.rms_norm import fused_add_rms_norm, rms_norm


def naive_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return (xd / torch.sqrt((xd * xd).sum(-1, keepdim=True) / x.shape[-1] + eps)) * w.double()


@pytest.mark.parametrize("shape", [(1, 8), (7, 64), (3, 5, 32)])
def test_rms_norm_matches_naive(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g) * 3
    w = torch.randn(shape[-1], generator=g)
    out = rms_norm(x, w, 1e-6)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), naive_rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_rms_norm_per_head_weight() -> None:
    # Qwen3 normalises q and k heads of one fused tensor with a [heads, head_dim] weight
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, 16, generator=g)
    w = torch.randn(6, 16, generator=g)
    out = rms_norm(x, w, 1e-6)
    for h in range(6):
        torch.testing.assert_close(out[:, h].double(), naive_rms_norm(x[:, h], w[h], 1e-6), rtol=1e-5, atol=1e-5)


def test_rms_norm_bf16_normalises_in_float32() -> None:
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 64, generator=g) * 50).bfloat16()
    w = torch.randn(64, generator=g).bfloat16()
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == torch.bfloat16
    ref = naive_rms_norm(x.float(), torch.ones(64), 1e-6).to(torch.bfloat16) * w  # HF order: cast, then weight
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_fused_add_rms_norm_returns_sum_and_leaves_inputs() -> None:
    g = torch.Generator().manual_seed(3)
    x, res, w = torch.randn(6, 32, generator=g), torch.randn(6, 32, generator=g), torch.randn(32, generator=g)
    x0, res0 = x.clone(), res.clone()
    out, new_res = fused_add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(new_res, x0 + res0)
    torch.testing.assert_close(out.double(), naive_rms_norm(x0 + res0, w, 1e-5), rtol=1e-5, atol=1e-5)
    assert torch.equal(x, x0) and torch.equal(res, res0)


@pytest.mark.parametrize("tokens,inter", [(1, 4), (9, 96)])
def test_silu_and_mul_matches_naive(tokens: int, inter: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 2 * inter, generator=g) * 4
    gate, up = x[:, :inter].double(), x[:, inter:].double()
    ref = gate / (1 + torch.exp(-gate)) * up
    out = silu_and_mul(x)
    assert out.shape == (tokens, inter) and not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
