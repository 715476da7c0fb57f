"""Quantized projection weights widened to fp32 in C (dequant.c), into a buffer the caller owns: bit-identical to
Fp8BlockWeight.dequantize / Int4Weight.dequantize (tests/shared/kernels/test_native_dequant.py), and ~10x faster
than torch's element-at-a-time float8 conversion and int4 unpacking."""

from __future__ import annotations

import torch

from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.kernels.int4_weight import Int4Weight
from shared.kernels.native.build import load_library


def dequantize_into(packed: Fp8BlockWeight | Int4Weight, out: torch.Tensor) -> torch.Tensor:
    """`packed` widened into out ([rows * cols] fp32 or larger, contiguous CPU); returns out's [rows, cols] view."""
    rows, cols = packed.shape
    assert out.dtype == torch.float32 and out.is_contiguous() and out.numel() >= rows * cols
    dst = out[: rows * cols].view(rows, cols)
    lib, threads = load_library(), torch.get_num_threads()
    if isinstance(packed, Fp8BlockWeight):
        w, s = packed.weight, packed.scale
        assert w.is_contiguous() and s.is_contiguous() and s.dtype == torch.float32
        nb = int(s.shape[1])
        lib.pdr_dequant_fp8_f32(w.data_ptr(), s.data_ptr(), rows, cols, nb, packed.block_k, dst.data_ptr(), threads)
        return dst
    q, z = packed.qweight.contiguous(), packed.qzeros.contiguous()
    scales = packed.scales.to(torch.float32).contiguous()  # [rows, groups]: 1/group of the weight's elements
    packing = 0 if packed.packing == "awq" else 1
    lib.pdr_dequant_int4_f32(
        q.data_ptr(),
        z.data_ptr(),
        scales.data_ptr(),
        rows,
        cols,
        packed.group,
        packing,
        packed.zero_offset,
        dst.data_ptr(),
        threads,
    )
    return dst
