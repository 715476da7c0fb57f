"""FP8 block-wise weights (e4m3, one float32 scale per block, as DeepSeek-V3 and Qwen3-*-FP8 ship them); the
linear backend that runs them is dequant_linear.DequantLinear.

The weight stays one byte per element in memory; each call widens it to the activations' dtype, multiplies each
block by its scale and runs the ordinary GEMM. That is the reference a faster kernel (an fp8 GEMM on GPU,
dequantization inside the native CPU GEMM) must match, and it is exactly what transformers computes on the
dequantized weights: the same fp8 -> fp32 widening (exact) and the same one product per element.

Scales are held per output row ([out, ceil(in / block_k)], the checkpoint's block rows repeated at load): the fused
q/k/v and gate/up weights then take any slice of rows, whether or not their boundaries fall on a block row (a
k_proj of 64 rows shares its 128-row block with nothing). The cost is out x in / block_k floats, 3% of the fp8 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


@dataclass(frozen=True)
class Fp8BlockWeight:
    """weight [out, in] float8_e4m3fn; scale [out, ceil(in / block_k)] float32 (dequantized = weight x scale)."""

    weight: torch.Tensor
    scale: torch.Tensor
    block_k: int

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.weight.shape[0]), int(self.weight.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[out, in] in `dtype`: each element widened to fp32 and times its block's scale, then cast."""
        out, k = self.shape
        nb = int(self.scale.shape[1])
        w = self.weight.to(torch.float32)
        if k == nb * self.block_k:  # whole blocks: one broadcast multiply, no expanded scale
            w = (w.view(out, nb, self.block_k) * self.scale.unsqueeze(-1)).view(out, k)
        else:
            w = w * self.scale.repeat_interleave(self.block_k, 1)[:, :k]
        return w if dtype == torch.float32 else w.to(dtype)


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (fp8 [out, in], scale_inv [ceil(out / bo), ceil(in / bi)] float32), each block scaled so
    its largest |value| maps to e4m3's max (the checkpoints' own recipe). For tests and benchmarks."""
    bo, bi = block
    out, k = w.shape
    pad = torch.zeros(-(-out // bo) * bo, -(-k // bi) * bi, dtype=torch.float32)
    pad[:out, :k] = w.float()
    blocks = pad.view(pad.shape[0] // bo, bo, pad.shape[1] // bi, bi)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)  # [rows of blocks, cols of blocks]
    scale = amax / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(pad.shape)[:out, :k].contiguous(), scale.float()


def quantize_fp8_rows(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> Fp8BlockWeight:
    """An unquantized [out, in] weight -> its Fp8BlockWeight (--quantization fp8 over a bf16/fp32 checkpoint)."""
    q, scale = quantize_fp8_block(w, block)
    return Fp8BlockWeight(q, scale.repeat_interleave(block[0], 0)[: w.shape[0]].contiguous(), block[1])
