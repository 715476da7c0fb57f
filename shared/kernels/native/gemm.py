"""The native few-row fp32 GEMM (skinny_gemm.c): pack a weight into 16-column panels once, multiply many times."""

from __future__ import annotations

import torch

from shared.kernels.native.build import load_library

PANEL = 16  # output columns per panel (NR in skinny_gemm.c)


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
