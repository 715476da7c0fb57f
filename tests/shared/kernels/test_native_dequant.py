"""The native widening of quantized weights (kernels/native/dequant.c) equals the torch references bit for bit:
Fp8BlockWeight.dequantize (every e4m3 byte, block-wise with a partial block, per channel) and Int4Weight.dequantize
(AWQ's interleaved and GPTQ's sequential packing, v1 zero points), on random packed words."""

from __future__ import annotations

import pytest
import torch

from shared.kernels.fp8_weight import Fp8BlockWeight, quantize_fp8_rows
from shared.kernels.int4_weight import Int4Weight
from shared.kernels.native.build import native_available
from shared.kernels.native.dequant import dequantize_into

pytestmark = pytest.mark.skipif(not native_available()[0], reason=native_available()[1])


def test_every_fp8_byte_widens_to_torchs_value() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # e4m3fn's two NaNs: never written (weights are clamped to +-448)
    w = codes.view(torch.float8_e4m3fn).view(2, -1)  # subnormals, zeros of both signs, +-448
    packed = Fp8BlockWeight(w, torch.tensor([[1.0], [0.5]]), int(w.shape[1]))
    assert torch.equal(dequantize_into(packed, torch.empty(w.numel())), packed.dequantize())


@pytest.mark.parametrize("block", [(128, 128), (1, 0)])
def test_fp8_block_and_per_channel_weights_match_the_reference(block: tuple[int, int]) -> None:
    w = torch.randn(320, 544, generator=torch.Generator().manual_seed(1)) * 0.05  # 544: a partial 128-block
    if block[1]:
        packed = quantize_fp8_rows(w, block)
    else:
        scale = w.abs().amax(1, keepdim=True) / 448
        packed = Fp8BlockWeight((w / scale).to(torch.float8_e4m3fn), scale, 544)
    buf = torch.full((320 * 544 + 7,), float("nan"))  # a reused buffer larger than the weight
    got = dequantize_into(packed, buf)
    assert got.shape == (320, 544) and got.data_ptr() == buf.data_ptr()
    assert torch.equal(got, packed.dequantize())


@pytest.mark.parametrize("packing", ["awq", "gptq"])
def test_int4_packings_match_the_reference(packing: str) -> None:
    g = torch.Generator().manual_seed(2)
    out, k, group = 64, 256, 32

    def words(*shape: int) -> torch.Tensor:
        return torch.randint(-(2**31), 2**31 - 1, shape, generator=g, dtype=torch.int32)

    qweight = words(out // 8, k) if packing == "awq" else words(out, k // 8)
    scales = (torch.rand(out, k // group, generator=g) * 0.01 + 1e-3).to(torch.float16)
    packed = Int4Weight(qweight, words(out // 8, k // group), scales, group, packing, int(packing == "gptq"))
    got = dequantize_into(packed, torch.empty(out * k))
    assert torch.equal(got, packed.dequantize())
