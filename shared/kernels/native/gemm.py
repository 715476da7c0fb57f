"""The native few-row fp32 GEMM (skinny_gemm.c): pack a weight into 16-column panels once, multiply many times.

The gated form packs a fused gate_up weight as gate/up panel pairs and returns silu(gate) * up from the same call.
"""

from __future__ import annotations

import torch

from shared.kernels.native.build import load_library

PANEL = 16  # output columns per panel (NR in skinny_gemm.c)


def vector_bits() -> int:
    """The width the kernel's tiles were built for on this host: 512 (AVX-512), 256 (AVX2 + FMA), 0 (plain C)."""
    return int(load_library().pdr_gemm_vector_bits())


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] fp32 CPU weight -> its panels, [ceil(out / 16), in, 16] (columns past `out` zero)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"native gemm packs 2-D fp32 CPU weights, got {tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().contiguous()
    n, k = w.shape
    out = torch.empty(((n + PANEL - 1) // PANEL, k, PANEL), dtype=torch.float32)
    load_library().pdr_gemm_pack_f32(w.data_ptr(), n, k, out.data_ptr())
    return out


def native_gemm(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, in] fp32 (rows may be strided, each row contiguous) -> [M, out_features] = x @ weight.T (+ bias)."""
    m, k = x.shape
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    if k != panels.shape[1]:
        raise ValueError(f"native gemm: x has {k} columns, the weight {panels.shape[1]}")
    out = torch.empty((m, out_features), dtype=torch.float32)
    if m == 0:
        return out
    if bias is not None:
        bias = bias.detach().float().contiguous()
    load_library().pdr_gemm_f32(
        x.data_ptr(),
        x.stride(0),
        m,
        k,
        panels.data_ptr(),
        out_features,
        bias.data_ptr() if bias is not None else None,
        out.data_ptr(),
        out_features,
        torch.get_num_threads(),
    )
    return out


def pack_gated_panels(weight: torch.Tensor) -> torch.Tensor:
    """[2 inter, in] fp32 CPU weight holding gate | up -> gate and up panels in pairs, [2 ceil(inter / 16), in, 16]."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[0] % 2:
        raise ValueError(f"native gemm packs [2 inter, in] fp32 CPU gate_up weights, got {tuple(weight.shape)}")
    w = weight.detach().contiguous()
    inter, k = w.shape[0] // 2, w.shape[1]
    out = torch.empty((2 * ((inter + PANEL - 1) // PANEL), k, PANEL), dtype=torch.float32)
    load_library().pdr_gemm_pack_gated_f32(w.data_ptr(), inter, k, out.data_ptr())
    return out


def native_gemm_silu_mul(x: torch.Tensor, panels: torch.Tensor, inter: int) -> torch.Tensor:
    """x [M, in] fp32 -> [M, inter] = silu(x @ gate.T) * (x @ up.T), panels from pack_gated_panels."""
    m, k = x.shape
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    if k != panels.shape[1] or panels.shape[0] != 2 * ((inter + PANEL - 1) // PANEL):
        raise ValueError(f"native gated gemm: x [{m}, {k}] and {inter} outputs do not fit panels {tuple(panels.shape)}")
    out = torch.empty((m, inter), dtype=torch.float32)
    if m == 0:
        return out
    scratch = torch.empty((m, panels.shape[0] * PANEL), dtype=torch.float32)
    load_library().pdr_gemm_silu_mul_f32(
        x.data_ptr(),
        x.stride(0),
        m,
        k,
        panels.data_ptr(),
        inter,
        scratch.data_ptr(),
        out.data_ptr(),
        inter,
        torch.get_num_threads(),
    )
    return out
