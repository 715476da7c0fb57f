"""The native few-row GEMM: pack a weight into 16-column panels once, multiply many times.

fp32 weights take skinny_gemm.c; bf16 weights take skinny_gemm_bf16.c (bf16 panels, fp32 x and output, products
summed in fp32 by vdpbf16ps: only where `bf16_kernels()`). The panels' dtype says which kernel a call runs. The
gated form packs a fused gate_up weight as gate/up panel pairs and returns silu(gate) * up from the same call.
"""

from __future__ import annotations

import torch

from shared.kernels.native.build import load_library

PANEL = 16  # output columns per panel (NR in skinny_gemm.c)
_PACKABLE = (torch.float32, torch.bfloat16)


def vector_bits() -> int:
    """The width the kernel's tiles were built for on this host: 512 (AVX-512), 256 (AVX2 + FMA), 0 (plain C)."""
    return int(load_library().pdr_gemm_vector_bits())


def bf16_kernels() -> bool:
    """Whether this host's build runs the bf16 kernels (the CPU has avx512_bf16)."""
    return bool(load_library().pdr_bf16_kernels())


def _panel_shape(n: int, k: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """fp32: [ceil(n / 16), k, 16]; bf16: [ceil(n / 16), ceil(k / 2), 32] (k pairs side by side)."""
    panels = (n + PANEL - 1) // PANEL
    return (panels, k, PANEL) if dtype == torch.float32 else (panels, (k + 1) // 2, 2 * PANEL)


def inner_size(panels: torch.Tensor) -> int:
    """The k the panels were packed for (an odd bf16 k reads as the next even one: its pad is zero)."""
    return int(panels.shape[1]) * (1 if panels.dtype == torch.float32 else 2)


def _check_weight(weight: torch.Tensor, what: str) -> torch.Tensor:
    if weight.dtype not in _PACKABLE or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"native gemm packs 2-D fp32 or bf16 CPU {what}, got {tuple(weight.shape)} {weight.dtype}")
    return weight.detach().contiguous()


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] fp32 or bf16 CPU weight -> its panels in the same dtype (see _panel_shape; columns past `out` 0)."""
    w = _check_weight(weight, "weights")
    n, k = w.shape
    out = torch.empty(_panel_shape(n, k, w.dtype), dtype=w.dtype)
    lib = load_library()
    pack = lib.pdr_gemm_pack_f32 if w.dtype == torch.float32 else lib.pdr_gemm_pack_bf16
    pack(w.data_ptr(), n, k, out.data_ptr())
    return out


def _x_rows(x: torch.Tensor, panels: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    k = x.shape[1]
    if k != inner_size(panels) and not (panels.dtype == torch.bfloat16 and k + 1 == inner_size(panels)):
        raise ValueError(f"native gemm: x has {k} columns, the weight {inner_size(panels)}")
    return x


def _check_rc(rc: int) -> None:
    if rc == -1:
        raise RuntimeError("the bf16 GEMM needs a CPU with avx512_bf16; use --dtype float32 on this host")
    if rc != 0:
        raise MemoryError("the bf16 GEMM could not allocate its copy of x")


def native_gemm(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, in] fp32 (rows may be strided, each row contiguous) -> [M, out_features] fp32 = x @ weight.T (+ bias)."""
    x = _x_rows(x, panels)
    m, k = x.shape
    out = torch.empty((m, out_features), dtype=torch.float32)
    if m == 0:
        return out
    if bias is not None:
        bias = bias.detach().float().contiguous()
    args = (
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
    lib = load_library()
    if panels.dtype == torch.float32:
        lib.pdr_gemm_f32(*args)
    else:
        _check_rc(lib.pdr_gemm_bf16(*args))
    return out


def pack_gated_panels(weight: torch.Tensor) -> torch.Tensor:
    """[2 inter, in] fp32 or bf16 CPU weight holding gate | up -> gate and up panels in pairs (2 ceil(inter / 16)
    panels)."""
    w = _check_weight(weight, "gate_up weights")
    if w.shape[0] % 2:
        raise ValueError(f"native gemm packs [2 inter, in] gate_up weights, got {tuple(w.shape)}")
    inter, k = w.shape[0] // 2, w.shape[1]
    panels, kk, width = _panel_shape(inter, k, w.dtype)
    out = torch.empty((2 * panels, kk, width), dtype=w.dtype)
    lib = load_library()
    pack = lib.pdr_gemm_pack_gated_f32 if w.dtype == torch.float32 else lib.pdr_gemm_pack_gated_bf16
    pack(w.data_ptr(), inter, k, out.data_ptr())
    return out


def native_gemm_silu_mul(x: torch.Tensor, panels: torch.Tensor, inter: int) -> torch.Tensor:
    """x [M, in] fp32 -> [M, inter] fp32 = silu(x @ gate.T) * (x @ up.T), panels from pack_gated_panels."""
    x = _x_rows(x, panels)
    m, k = x.shape
    if panels.shape[0] != 2 * ((inter + PANEL - 1) // PANEL):
        raise ValueError(f"native gated gemm: x [{m}, {k}] and {inter} outputs do not fit panels {tuple(panels.shape)}")
    out = torch.empty((m, inter), dtype=torch.float32)
    if m == 0:
        return out
    scratch = torch.empty((m, panels.shape[0] * PANEL), dtype=torch.float32)
    args = (
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
    lib = load_library()
    if panels.dtype == torch.float32:
        lib.pdr_gemm_silu_mul_f32(*args)
    else:
        _check_rc(lib.pdr_gemm_silu_mul_bf16(*args))
    return out
