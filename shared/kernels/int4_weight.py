"""int4 weights (4-bit, a float16 scale and a 4-bit zero point per group of `group` input columns) as AWQ and GPTQ
ship them, held packed, 8 weights per int32, and dequantized on the fly by dequant_linear.DequantLinear.

AWQ (AutoAWQ's GEMM format) stores qweight [in, out / 8] and qzeros [in / group, out / 8] with the 8 output columns
of each int32 interleaved (nibble j holds column 8c + _ORDER[j]); GPTQ stores qweight [in / 8, out] (8 input rows per
int32, in order) and qzeros [in / group, out / 8] (in order; its v1 format stores zero - 1). Both store scales
[in / group, out]. They are held transposed here (output rows first) so that the fused q/k/v and gate/up weights are
slices of rows, like every other weight (weights.py's slots). Dequantized: (q - zero) x scale, in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# nibble j of a packed int32 holds output column 8c + _ORDER[j]; _INVERSE reads them back in column order
_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_INVERSE = (0, 4, 1, 5, 2, 6, 3, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[rows / 8, cols] int32 (AWQ's interleaved nibbles along rows) -> [rows, cols] int32 values 0..15."""
    r8, cols = packed.shape
    nib = (packed.unsqueeze(1) >> _SHIFTS.view(1, 8, 1)) & 0xF  # [rows / 8, 8 (nibble), cols]
    return nib[:, list(_INVERSE)].reshape(r8 * 8, cols)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] values 0..15 -> [rows / 8, cols] int32 in AWQ's interleaved order (the inverse of unpack_int4)."""
    rows, cols = values.shape
    v = values.to(torch.int32).view(rows // 8, 8, cols)[:, list(_ORDER)]  # nibble j <- column 8c + _ORDER[j]
    return (v << _SHIFTS.view(1, 8, 1)).sum(dim=1, dtype=torch.int32)


def unpack_int4_seq(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """GPTQ's packing: 8 values per int32 along `dim` (0 or 1), nibble j holding value 8c + j."""
    if dim == 1:
        return unpack_int4_seq(packed.t(), 0).t()
    r8, cols = packed.shape
    return ((packed.unsqueeze(1) >> _SHIFTS.view(1, 8, 1)) & 0xF).reshape(r8 * 8, cols)


@dataclass(frozen=True)
class Int4Weight:
    """awq: qweight [out / 8, in], qzeros [out / 8, in / group]; gptq: qweight [out, in / 8], qzeros
    [out / 8, in / group] with `zero_offset` added (1 for GPTQ's v1 format); both int32. scales [out, in / group]."""

    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor
    group: int
    packing: str = "awq"
    zero_offset: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        r, c = int(self.qweight.shape[0]), int(self.qweight.shape[1])
        return (r * 8, c) if self.packing == "awq" else (r, c * 8)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[out, in] in `dtype`: (q - zero) x scale per group of input columns, in fp32, then cast."""
        out, k = self.shape
        if self.packing == "awq":
            q, z = unpack_int4(self.qweight), unpack_int4(self.qzeros)
        else:
            q, z = unpack_int4_seq(self.qweight, 1), unpack_int4_seq(self.qzeros, 0) + self.zero_offset
        q, z = q.view(out, k // self.group, self.group), z.unsqueeze(-1)  # [out, groups, group], [out, groups, 1]
        w = ((q - z).to(torch.float32) * self.scales.to(torch.float32).unsqueeze(-1)).view(out, k)
        return w if dtype == torch.float32 else w.to(dtype)
