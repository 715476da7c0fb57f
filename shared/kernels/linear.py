"""The model's dense projections: torch's F.linear, or oneDNN over weights reordered once at load.

Why a second kernel on CPU: at decode batch sizes (M = 1-64 rows) torch's fp32 F.linear (MKL sgemm) streams each
weight matrix from DRAM at 5-8 GB/s, a third of the machine's copy rate. oneDNN's inner-product primitive over a
weight reordered once into its blocked layout measured 1.7-1.9x faster on the bundled model's layer shapes and
~3x on its lm_head at M = 16 (fp32, 2 threads, weights far larger than the caches), and ~1.4x at M = 2048
(prefill). vLLM's CPU backend makes the same choice (prepacked oneDNN GEMMs).

The model decides which projections take the fast kernel (see models/llama.py: the down projection runs on the
backend's `exact()` form, F.linear where the backend would use oneDNN, for HF parity). A backend is chosen once per
model runner, like the attention backend.

The `native` backend (the CPU default where the C kernels build) runs steps of few rows, decode steps, on
shared/kernels/native/skinny_gemm.c and larger ones on the backend it wraps. At 16 rows (2 threads, fp32, weights far
larger than the caches) it measured 1.1-1.4x oneDNN's speed on the bundled model's hidden-size projections, ~1.1x
on its lm_head, and ~2x MKL's on the down projection; at one row 1.1-1.7x oneDNN's. At a full prefill chunk (512
rows) oneDNN's blocking wins (see NATIVE_MAX_ROWS). Its sums are blocked like MKL's (rounding error on par with
MKL's, half of oneDNN's on K = 1536), so the down projection may take it without leaving the HF-parity contract.
Cost: each weight is held twice (the native panels next to the wrapped backend's copy).

bf16 on CPU: where the CPU has avx512_bf16 (gemm.bf16_kernels()) the native backend packs bf16 weights into bf16
panels (skinny_gemm_bf16.c: half the bytes a decode step streams, vdpbf16ps sums in fp32) and wraps oneDNN's bf16
inner product for larger steps. The model's activations stay fp32 there (llama.py's act_dtype); a backend whose
weight dtype differs from x's casts x to the weight's dtype and the result back (the torch and oneDNN backends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.kernels.int4_weight import Int4Weight

LINEAR_BACKENDS = ("auto", "torch", "onednn", "native")

# Steps of up to this many rows take the native kernel. Against oneDNN the whole decode step measured faster at 16
# rows (70.6 vs 79 ms on the bundled model, Zen 4) and slower at 32 (82 vs 77 ms); on Zen 5 per projection the kernel
# wins at 16 rows, oneDNN on most shapes from 32-48 up. Since the kernel streams its next K block into L2
# (skinny_gemm.c) it leads oneDNN per layer projection up to ~144 rows on Zen 4 (qkv at 32 / 64 / 144 rows: 223 /
# 373 / 802 us vs 320 / 526 / 897), but a limit of 144 (the LM head kept at 24) measured no change end to end
# (engine, 64 requests at concurrency 16, 128/64 and varied lengths: within the runs' +-5%), so it stays at 24.
NATIVE_MAX_ROWS = 24
# The down projection's exact form (in place of MKL's F.linear, see models/llama.py) takes the native kernel at every
# step size where its tiles are AVX-512: on Zen 4 it was faster than MKL up to ~256 rows and on par at 512; on Zen 5
# MKL's fp32 GEMM runs at 55-170 GFLOPS at 16-512 rows against the kernel's 185-270 (oneDNN 160-365), so prefill
# chunks gain too (engine, 64 requests 128/64 at concurrency 16: 220-224 -> 243-261 tok/s). None: no limit.
NATIVE_EXACT_MAX_ROWS: int | None = None
# With AVX2 tiles (6 rows x 16 columns, no AVX-512) MKL takes over above this many rows. Zen 3, 2 threads, 30 down
# projections from DRAM, GFLOPS native / MKL: 48-112 rows 129-135 / 112-125, 128 rows 130-135 / 111-150, 160-192
# 115-120 / 122-130, 690 rows 124-128 / 155-173 (the kernel re-reads each row tile's x from L3 for every panel, MKL
# blocks both). In the engine a 690-token prefill step's down projections took 300 -> 227-244 ms, the step 1210 ->
# 1121-1134 ms.
NATIVE_EXACT_MAX_ROWS_AVX2 = 128

# oneDNN picks its kernel blocking from a row-count hint when it reorders a weight; any row count runs afterwards.
# 16 is the decode batch the reorder is tuned for (measured: the hint changes nothing at M = 1-2048 here).
_REORDER_ROWS_HINT = 16


@dataclass(frozen=True)
class NativePacked:
    """A weight as the native backend holds it: 16-column panels for few rows, the wrapped backend's handle else.

    gated: a fused gate_up weight whose panels come in gate/up pairs (pack_gated); only apply_gated reads those.
    """

    panels: torch.Tensor
    wide: torch.Tensor
    out_features: int
    gated: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, int(self.panels.shape[1]) * (1 if self.panels.dtype == torch.float32 else 2)


PackedWeight = torch.Tensor | NativePacked | Fp8BlockWeight | Int4Weight  # the last two: dequant_linear.py's


class LinearBackend(Protocol):
    name: str

    def pack(self, weight: torch.Tensor) -> PackedWeight:
        """[out, in] weight -> the handle `apply` takes (may be the weight itself)."""
        ...

    def apply(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] -> [M, out] = x @ weight.T + bias."""
        ...

    def exact(self) -> LinearBackend:
        """This backend with F.linear where it would use oneDNN: for the projections HF parity needs MKL's sums on."""
        ...

    def pack_gated(self, weight: torch.Tensor) -> PackedWeight:
        """A fused [2 inter, in] gate_up weight -> the handle `apply` and `apply_gated` take."""
        ...

    def apply_gated(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor | None:
        """silu(x @ gate.T) * (x @ up.T) in one call where the backend fuses it at this row count, else None (the
        caller runs `apply` and its own silu_and_mul)."""
        ...


class TorchLinear:
    """F.linear: the same GEMM transformers runs (MKL on CPU, cuBLAS on GPU)."""

    name = "torch"

    def pack(self, weight: torch.Tensor) -> PackedWeight:
        return weight

    def apply(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert isinstance(packed, torch.Tensor)
        if x.dtype != packed.dtype:  # fp32 activations over bf16 weights (see the module's docstring)
            return F.linear(x.to(packed.dtype), packed, _cast(bias, packed.dtype)).to(x.dtype)
        return F.linear(x, packed, bias)

    def exact(self) -> LinearBackend:
        return self

    def pack_gated(self, weight: torch.Tensor) -> PackedWeight:
        return self.pack(weight)

    def apply_gated(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor | None:
        return None


class OneDnnLinear:
    """oneDNN inner product over a prepacked (opaque, oneDNN-layout) copy of the weight. CPU only.

    The first call at a new row count builds a oneDNN primitive (~1 ms per weight shape, cached by oneDNN after).
    """

    name = "onednn"

    def pack(self, weight: torch.Tensor) -> PackedWeight:
        if weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"onednn linear packs 2-D CPU weights, got {tuple(weight.shape)} on {weight.device}")
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _REORDER_ROWS_HINT)

    def exact(self) -> LinearBackend:
        return TorchLinear()

    def apply(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert isinstance(packed, torch.Tensor)
        if x.shape[0] == 0:  # no rows (a step where no sequence wants logits): oneDNN rejects empty shapes
            return x.new_empty((0, packed.shape[0]))
        if x.dtype != packed.dtype:  # fp32 activations over bf16 weights (see the module's docstring)
            xw = x.to(packed.dtype).contiguous()
            return torch.ops.mkldnn._linear_pointwise(xw, packed, _cast(bias, packed.dtype), "none", [], "").to(x.dtype)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")

    def pack_gated(self, weight: torch.Tensor) -> PackedWeight:
        return self.pack(weight)

    def apply_gated(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor | None:
        return None


def _cast(bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return bias if bias is None or bias.dtype == dtype else bias.to(dtype)


class NativeLinear:
    """The native few-row kernel for steps of up to `max_rows` rows (None: every step), `wide` for larger ones. CPU;
    fp32 weights, or bf16 ones where the CPU runs the bf16 kernels; the output in x's dtype."""

    name = "native"

    def __init__(self, wide: LinearBackend, max_rows: int | None = NATIVE_MAX_ROWS) -> None:
        # imported here, once: a torch- or oneDNN-backend process never loads the C library
        from shared.kernels.native import gemm

        self.wide = wide
        self.max_rows = max_rows
        self._gemm = gemm

    def pack(self, weight: torch.Tensor) -> PackedWeight:
        wide = self.wide.pack(weight)
        assert isinstance(wide, torch.Tensor)  # the wrapped backend is torch or oneDNN, never native again
        return NativePacked(self._gemm.pack_panels(weight), wide, int(weight.shape[0]))

    def apply(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert isinstance(packed, NativePacked)
        if self.max_rows is not None and x.shape[0] > self.max_rows:
            return self.wide.apply(x, packed.wide, bias)
        if packed.gated:  # its panels are gate/up pairs, in an order no caller of apply expects
            raise ValueError("a weight packed by pack_gated takes apply_gated at this row count")
        out = self._gemm.native_gemm(x, packed.panels, packed.out_features, bias)
        return out if x.dtype == out.dtype else out.to(x.dtype)

    def pack_gated(self, weight: torch.Tensor) -> PackedWeight:
        wide = self.wide.pack(weight)
        assert isinstance(wide, torch.Tensor)
        return NativePacked(self._gemm.pack_gated_panels(weight), wide, int(weight.shape[0]), gated=True)

    def apply_gated(self, x: torch.Tensor, packed: PackedWeight) -> torch.Tensor | None:
        """The few-row steps' gate_up projection with silu-and-mul in the GEMM's epilogue (skinny_gemm.c): each
        thread finishes the 16 outputs of the gate/up panel pair it just summed, so the activation neither reads the
        projection back from DRAM or the other core's cache nor costs a call of its own. The same sums and formula
        as apply + the native silu_and_mul (bit-identical). Larger steps: None (the wide GEMM, then the op)."""
        assert isinstance(packed, NativePacked)
        if not packed.gated or (self.max_rows is not None and x.shape[0] > self.max_rows):
            return None
        out = self._gemm.native_gemm_silu_mul(x, packed.panels, packed.out_features // 2)
        return out if x.dtype == out.dtype else out.to(x.dtype)

    def exact(self) -> LinearBackend:
        wide = self.wide.exact()
        if wide.name != "torch":
            return NativeLinear(wide, self.max_rows)
        return NativeLinear(wide, native_exact_max_rows(self._gemm.vector_bits()))


def native_exact_max_rows(vector_bits: int) -> int | None:
    """The most rows the exact form's native kernel takes, for tiles of `vector_bits` (None: every step)."""
    return NATIVE_EXACT_MAX_ROWS if vector_bits >= 512 else NATIVE_EXACT_MAX_ROWS_AVX2


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def select_linear_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> LinearBackend:
    """'auto' | 'torch' | 'onednn' | 'native' for weights of `dtype` on `device` -> a backend.

    auto: for fp32 on CPU, native over oneDNN where the C kernels build and torch has oneDNN (oneDNN alone, or
    F.linear, where either is missing); for bf16 on CPU, native over oneDNN's bf16 where the CPU runs the bf16
    kernels (avx512_bf16), else F.linear; F.linear elsewhere (on GPU cuBLAS is the fast path).
    """
    dev = torch.device(device)
    if name not in LINEAR_BACKENDS:
        raise ValueError(f"linear_backend {name!r} is unknown; use one of: {', '.join(LINEAR_BACKENDS)}")
    fp32_cpu = dev.type == "cpu" and dtype == torch.float32
    bf16_cpu = dev.type == "cpu" and dtype == torch.bfloat16
    if name == "auto":
        name = "onednn" if fp32_cpu and onednn_available() else "torch"
        if (fp32_cpu or bf16_cpu) and native_linear_ok(dtype)[0]:
            name = "native"
    if name == "native":
        if not (fp32_cpu or bf16_cpu):
            raise ValueError(
                f"linear_backend 'native' runs fp32 or bf16 on cpu, not {dtype} on {dev.type}; "
                "use --linear-backend torch"
            )
        ok, why = native_linear_ok(dtype)
        if not ok:
            raise ValueError(f"linear_backend 'native' is unavailable: {why}; use --linear-backend onednn")
        return NativeLinear(OneDnnLinear() if onednn_available() else TorchLinear())
    if name == "onednn":
        if dev.type != "cpu":
            raise ValueError(f"linear_backend 'onednn' runs on cpu, not {dev.type}; use --linear-backend torch")
        if not onednn_available():
            raise ValueError(
                "linear_backend 'onednn' needs a torch built with oneDNN (mkldnn); use --linear-backend torch"
            )
        return OneDnnLinear()
    return TorchLinear()


def native_linear_ok(dtype: torch.dtype) -> tuple[bool, str]:
    """(True, "") where the native GEMM runs weights of `dtype` on this host, else (False, why)."""
    from shared.kernels.native.build import native_available

    ok, why = native_available()
    if ok and dtype == torch.bfloat16:
        from shared.kernels.native.gemm import bf16_kernels

        if not bf16_kernels():
            return False, "this CPU has no avx512_bf16 for the bf16 kernels"
    return ok, why
