"""The linear backends: oneDNN over prepacked weights computes what F.linear computes (fp32 rounding apart) at
every row count the engine uses, with and without bias, including no rows; selection and its errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shared.kernels.linear import OneDnnLinear, TorchLinear, onednn_available, select_linear_backend

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 3, 16, 17, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_matches_float64_reference(rows: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 80, generator=g) * 0.1
    b = torch.randn(96, generator=g) if with_bias else None
    x = torch.randn(rows, 80, generator=g)
    kernel = OneDnnLinear()
    out = kernel.apply(x, kernel.pack(w), b)
    ref = F.linear(x.double(), w.double(), b.double() if b is not None else None)
    assert out.shape == (rows, 96) and out.dtype == torch.float32
    if rows:
        assert (out.double() - ref).abs().max().item() < 1e-5


@needs_onednn
def test_onednn_pack_copies_the_weight() -> None:
    """The packed handle must not alias the weight: the model frees the original after packing."""
    w = torch.randn(32, 16)
    kernel = OneDnnLinear()
    packed = kernel.pack(w)
    x = torch.randn(4, 16)
    before = kernel.apply(x, packed)
    w.zero_()
    assert torch.equal(kernel.apply(x, packed), before)


@needs_onednn
def test_onednn_takes_non_contiguous_rows() -> None:
    w = torch.randn(24, 16)
    x = torch.randn(16, 10).t()  # [10, 16], transposed view
    kernel = OneDnnLinear()
    assert torch.allclose(kernel.apply(x, kernel.pack(w)), F.linear(x, w), atol=1e-5)


def test_torch_backend_is_f_linear() -> None:
    w, x = torch.randn(8, 4), torch.randn(3, 4)
    kernel = TorchLinear()
    assert kernel.pack(w) is w
    assert torch.equal(kernel.apply(x, w), F.linear(x, w))


def test_selection() -> None:
    auto_cpu = select_linear_backend("auto", "cpu", torch.float32)
    assert auto_cpu.name in ("native", "onednn" if onednn_available() else "torch")  # native: test_native_gemm.py
    # bf16 on cpu: native where the CPU runs the bf16 kernels (test_native_gemm.py), F.linear elsewhere
    assert select_linear_backend("auto", "cpu", torch.bfloat16).name in ("native", "torch")
    assert select_linear_backend("auto", "cpu", torch.float16).name == "torch"
    assert select_linear_backend("auto", "cuda", torch.float32).name == "torch"
    assert select_linear_backend("torch", "cpu", torch.float32).name == "torch"


def test_selection_errors_name_the_flag() -> None:
    with pytest.raises(ValueError, match="unknown"):
        select_linear_backend("mkl", "cpu", torch.float32)
    with pytest.raises(ValueError, match="--linear-backend torch"):
        select_linear_backend("onednn", "cuda", torch.float32)
