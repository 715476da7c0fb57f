"""The elementwise kernel set follows the attention backend: torch references with 'torch', the Triton kernels
with 'triton' (same call signatures, same numbers under the interpreter), nothing for an unknown name."""

from __future__ import annotations

import pytest
import torch

from shared.kernels.elementwise import TORCH_OPS, elementwise_ops


def test_torch_backend_gets_the_reference_ops() -> None:
    assert elementwise_ops("torch") is TORCH_OPS and TORCH_OPS.name == "torch"


def test_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'cuda-magic'"):
        elementwise_ops("cuda-magic")


def test_triton_ops_agree_with_the_references() -> None:
    tri = elementwise_ops("triton")
    assert tri.name == "triton"
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    x, res = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)
    w = torch.randn(64, generator=g)
    torch.testing.assert_close(tri.rms_norm(x, w, 1e-6), TORCH_OPS.rms_norm(x, w, 1e-6), atol=1e-5, rtol=1e-5)
    for a, b in zip(tri.fused_add_rms_norm(x, res, w, 1e-6), TORCH_OPS.fused_add_rms_norm(x, res, w, 1e-6)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    q = torch.randn(5, 3, 16, generator=g)
    ang = torch.rand(5, 1, 8, generator=g) * 6.28
    torch.testing.assert_close(
        tri.apply_rotary(q, ang.cos(), ang.sin()), TORCH_OPS.apply_rotary(q, ang.cos(), ang.sin()), atol=1e-5, rtol=1e-5
    )
    gu = torch.randn(5, 128, generator=g)
    torch.testing.assert_close(tri.silu_and_mul(gu), TORCH_OPS.silu_and_mul(gu), atol=1e-5, rtol=1e-5)
