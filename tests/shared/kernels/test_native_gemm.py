"""The native few-row GEMM (shared/kernels/native/skinny_gemm.c) and the `native` linear backend around it: the
float64 reference's result (fp32 rounding apart) at every row count a register tile can end on, column counts off the 32-column pair tile and
the 16-column panel, inner sizes off the 192-k block, with and without bias, strided rows, no rows; larger steps go
to the wrapped backend; the gated form (silu-and-mul in the epilogue) equal to the GEMM then the op; selection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shared.kernels.linear import (
    NATIVE_EXACT_MAX_ROWS,
    NATIVE_EXACT_MAX_ROWS_AVX2,
    NATIVE_MAX_ROWS,
    NativeLinear,
    NativePacked,
    OneDnnLinear,
    TorchLinear,
    onednn_available,
    select_linear_backend,
)
from shared.kernels.native import elementwise
from shared.kernels.native import gemm as gemm_module
from shared.kernels.native.build import native_available
from shared.kernels.native.gemm import native_gemm

pytestmark = pytest.mark.skipif(not native_available()[0], reason=f"native kernels: {native_available()[1]}")


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), b.double() if b is not None else None)


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 8, 9, 15, 16, 17, 24])
@pytest.mark.parametrize(("out_features", "in_features"), [(96, 80), (37, 300), (16, 513), (20, 64), (64, 700)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_reference(rows: int, out_features: int, in_features: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    w = torch.randn(out_features, in_features, generator=g) * 0.1
    b = torch.randn(out_features, generator=g) if with_bias else None
    x = torch.randn(rows, in_features, generator=g)
    kernel = NativeLinear(TorchLinear())
    out = kernel.apply(x, kernel.pack(w), b)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    if rows:
        assert (out.double() - _ref(x, w, b)).abs().max().item() < 2e-5


def test_error_is_on_par_with_mkl_on_a_long_inner_size() -> None:
    """K = 1536 (the bundled model's down projection): the blocked sums keep the error near F.linear's."""
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(576, 1536, generator=g), torch.randn(16, 1536, generator=g)
    kernel = NativeLinear(TorchLinear())
    ref = _ref(x, w, None)
    native = (kernel.apply(x, kernel.pack(w)).double() - ref).abs().max().item()
    mkl = (F.linear(x, w).double() - ref).abs().max().item()
    assert native < 2 * mkl


def test_takes_strided_rows_and_copies_the_weight() -> None:
    w = torch.randn(40, 16)
    base = torch.randn(10, 32)
    x = base[:, :16]  # rows 32 floats apart, each contiguous
    kernel = NativeLinear(TorchLinear())
    packed = kernel.pack(w)
    before = kernel.apply(x, packed)
    assert torch.allclose(before, F.linear(x, w), atol=1e-5)
    w_copy = w.clone()
    w.zero_()  # the panels are a copy: the model may free the original
    assert torch.equal(kernel.apply(x, packed)[:, :], before)
    assert torch.allclose(before, F.linear(x, w_copy), atol=1e-5)


def test_larger_steps_go_to_the_wrapped_backend(monkeypatch) -> None:
    w = torch.randn(32, 16)
    kernel = NativeLinear(TorchLinear())
    packed = kernel.pack(w)
    assert isinstance(packed, NativePacked) and packed.shape == (32, 16) and packed.wide is w
    calls = []
    monkeypatch.setattr("shared.kernels.native.gemm.load_library", lambda: calls.append(1) or pytest.fail("native"))
    x = torch.randn(NATIVE_MAX_ROWS + 1, 16)
    assert torch.equal(kernel.apply(x, packed), F.linear(x, w))


def test_exact_takes_the_native_kernel_at_every_step_with_avx512_tiles(monkeypatch) -> None:
    monkeypatch.setattr("shared.kernels.native.gemm.vector_bits", lambda: 512)
    wide = OneDnnLinear() if onednn_available() else TorchLinear()
    exact = NativeLinear(wide).exact()
    assert isinstance(exact, NativeLinear) and exact.wide.name == "torch"
    assert exact.max_rows is NATIVE_EXACT_MAX_ROWS is None
    w = torch.randn(40, 300)
    packed = exact.pack(w)
    monkeypatch.setattr(exact.wide, "apply", lambda *a: pytest.fail("a prefill-sized step left the native kernel"))
    x = torch.randn(600, 300, dtype=torch.float64).float()
    torch.testing.assert_close(exact.apply(x, packed), _ref(x, w, None).float(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("bits", [256, 0])
def test_exact_hands_prefill_steps_to_mkl_with_narrower_tiles(monkeypatch, bits: int) -> None:
    monkeypatch.setattr("shared.kernels.native.gemm.vector_bits", lambda: bits)
    exact = NativeLinear(TorchLinear()).exact()
    assert isinstance(exact, NativeLinear) and exact.max_rows == NATIVE_EXACT_MAX_ROWS_AVX2
    w = torch.randn(40, 300)
    packed = exact.pack(w)
    x = torch.randn(NATIVE_EXACT_MAX_ROWS_AVX2 + 1, 300)
    assert torch.equal(exact.apply(x, packed), F.linear(x, w))  # MKL's sums, bit for bit
    few = x[:NATIVE_EXACT_MAX_ROWS_AVX2]
    assert torch.equal(exact.apply(few, packed), native_gemm(few, packed.panels, 40, None))


def test_the_build_reports_its_tile_width() -> None:
    assert gemm_module.vector_bits() in (0, 256, 512)


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 15, 16, 17, 24])
@pytest.mark.parametrize(("inter", "in_features"), [(1536, 576), (40, 300), (37, 513), (16, 64)])
def test_gated_equals_the_gemm_then_silu_and_mul(rows: int, inter: int, in_features: int) -> None:
    """Panel pairs off the 16-column panel and inner sizes off the 192-k block: the same sums, the same formula."""
    g = torch.Generator().manual_seed(rows * 7 + inter)
    w = torch.randn(2 * inter, in_features, generator=g) * 0.1
    x = torch.randn(rows, in_features, generator=g)
    kernel = NativeLinear(TorchLinear())
    gated = kernel.pack_gated(w)
    assert isinstance(gated, NativePacked) and gated.gated
    out = kernel.apply_gated(x, gated)
    assert out is not None and out.shape == (rows, inter)
    assert torch.equal(out, elementwise.silu_and_mul(kernel.apply(x, kernel.pack(w))))
    ref = _ref(x, w, None)
    torch.testing.assert_close(out.double(), F.silu(ref[:, :inter]) * ref[:, inter:], atol=1e-4, rtol=1e-4)


def test_gated_larger_steps_and_other_backends_decline() -> None:
    w, x = torch.randn(64, 16), torch.randn(NATIVE_MAX_ROWS + 1, 16)
    kernel = NativeLinear(TorchLinear())
    gated = kernel.pack_gated(w)
    assert kernel.apply_gated(x, gated) is None  # a prefill chunk: the wide GEMM, then the op
    assert torch.equal(kernel.apply(x, gated), F.linear(x, w))
    with pytest.raises(ValueError, match="apply_gated"):  # pair-ordered panels never reach the plain path
        kernel.apply(x[:4], gated)
    assert kernel.apply_gated(x[:4], kernel.pack(w)) is None  # a plainly packed weight
    for other in (TorchLinear(), *((OneDnnLinear(),) if onednn_available() else ())):
        assert other.apply_gated(x[:4], other.pack_gated(w)) is None


def test_selection() -> None:
    assert select_linear_backend("auto", "cpu", torch.float32).name == "native"
    assert select_linear_backend("native", "cpu", torch.float32).name == "native"
    # bf16: native where the CPU runs the bf16 kernels (avx512_bf16), F.linear elsewhere
    bf16 = gemm_module.bf16_kernels()
    assert select_linear_backend("auto", "cpu", torch.bfloat16).name == ("native" if bf16 else "torch")
    with pytest.raises(ValueError, match="--linear-backend torch"):
        select_linear_backend("native", "cuda", torch.float32)
    with pytest.raises(ValueError, match="--linear-backend torch"):
        select_linear_backend("native", "cpu", torch.float16)
    if not bf16:
        with pytest.raises(ValueError, match="avx512_bf16"):
            select_linear_backend("native", "cpu", torch.bfloat16)
