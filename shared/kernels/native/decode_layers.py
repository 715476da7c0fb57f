"""Every decoder layer of a pure decode step in one C call (decode_layers.c), for llama-family models whose
projections, elementwise ops and attention all run on the native backends.

The C side calls the same kernels with the same arguments, in the same order, as the layers' Python forward, so
the hidden states are bit-identical (tests/shared/kernels/test_native_decode_layers.py); what goes is the ~240
Python wrappers a step and the Python between them. Steps it does not take (prefill chunks, mixed steps, more
rows than the few-row GEMM's limit) run the layers one by one as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from shared.kernels.native.build import load_library

if TYPE_CHECKING:
    from shared.kernels.attention_plan import FlatDecode

_PTRS_PER_LAYER = 10  # decode_layers.c's L_N


class LayerWeights:
    """One layer's tensors as the C call reads them: norms, biases (fp32) and the native GEMM's packed panels (gate_up's
    in gate/up pairs, gemm.pack_gated_panels; the others gemm.pack_panels), fp32 or bf16 panels alike."""

    def __init__(
        self,
        input_norm: torch.Tensor,
        qkv: torch.Tensor,
        qkv_bias: torch.Tensor | None,
        o: torch.Tensor,
        o_bias: torch.Tensor | None,
        post_norm: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
    ) -> None:
        # norms and biases fp32, panels as packed; contiguous (a no-op for the model's own tensors), held here so
        # the addresses stay valid
        self.bf16 = qkv.dtype == torch.bfloat16
        panels = (qkv, o, gate_up, down)
        if any(p.dtype != qkv.dtype for p in panels):
            raise ValueError("the fused decode call needs every panel of a layer in one dtype")
        self.tensors = [
            None
            if t is None
            else t.detach().contiguous()
            if any(t is p for p in panels)
            else t.detach().float().contiguous()
            for t in (input_norm, qkv, qkv_bias, o, o_bias, post_norm, gate_up, down)
        ]

    def addresses(self) -> list[int]:
        return [t.data_ptr() if t is not None else 0 for t in self.tensors]


class NativeDecodeLayers:
    """The C call over all layers, with the per-layer addresses packed once (weights) or once per KV pool (caches)."""

    def __init__(
        self,
        layers: Sequence[LayerWeights],
        *,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        inter: int,
        eps: float,
        max_rows: int | None,
    ) -> None:
        self.layers = list(layers)
        self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter = hidden, heads, kv_heads, head_dim, inter
        self.eps, self.scale, self.max_rows = eps, head_dim**-0.5, max_rows
        self._weights = [layer.addresses() for layer in self.layers]
        self.bf16 = bool(self.layers) and self.layers[0].bf16
        if any(layer.bf16 != self.bf16 for layer in self.layers):
            raise ValueError("the fused decode call needs every layer's panels in one dtype")
        self._table: torch.Tensor | None = None  # [layers, 10] int64 addresses, set by bind_caches
        self._cache_shape: tuple[int, int, int] = (0, 0, 0)  # pages, tokens a page, elements between pages
        self.pool: object | None = None  # what owns the bound caches (the caller's KV pool)
        self._lib = load_library()

    def takes(self, rows: int, flat: FlatDecode | None, extend_rows: Sequence[int]) -> bool:
        """A step this call runs: only decode tokens (all planned flat), within the few-row GEMM's row limit."""
        return (
            flat is not None
            and not extend_rows
            and 0 < rows == flat.token_idx.shape[0]
            and (self.max_rows is None or rows <= self.max_rows)
        )

    def bind_caches(self, pool: object, k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor]) -> None:
        """Every layer's K/V cache (`pool`'s views, one layout for all), checked and packed with the weights'
        addresses once per pool, not once per step. The caches must outlive the calls that follow."""
        k0 = k_caches[0]
        want = torch.bfloat16 if self.bf16 else torch.float32
        for c in (*k_caches, *v_caches):
            if c.stride() != k0.stride() or c.shape != k0.shape or c.dtype != want:
                raise ValueError(f"every layer's K/V cache must share one {want} layout for the fused decode call")
        if k0.stride(3) != 1 or k0.stride(2) != self.head_dim or k0.stride(1) != self.kv_heads * self.head_dim:
            raise ValueError(f"fused decode needs each cache page contiguous, got strides {k0.stride()}")
        rows = [[*w, k.data_ptr(), v.data_ptr()] for w, k, v in zip(self._weights, k_caches, v_caches, strict=True)]
        self._table = torch.tensor(rows, dtype=torch.int64)
        assert self._table.shape[1] == _PTRS_PER_LAYER
        self._cache_shape = (k0.shape[0], k0.shape[1], k0.stride(0))
        self.pool = pool

    def run(
        self,
        x0: torch.Tensor,
        residual: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        out_pages: torch.Tensor,
        out_offsets: torch.Tensor,
        flat: FlatDecode,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x0: layer 0's normed input [T, hidden]; residual: layer 0's residual (updated in place) -> (the last
        layer's MLP output, the residual stream), as the layers' forward returns them. The caches: bind_caches."""
        if self._table is None:
            raise RuntimeError("bind_caches first: the fused decode call has no K/V caches")
        t = x0.shape[0]
        num_pages, page_size, page_stride = self._cache_shape
        x0, residual = x0.contiguous(), residual.contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        pages, offsets = out_pages.contiguous(), out_offsets.contiguous()
        out = torch.empty((t, self.hidden), dtype=torch.float32)
        dims = torch.tensor(
            [
                t,
                self.hidden,
                self.heads,
                self.kv_heads,
                self.head_dim,
                self.inter,
                num_pages,
                page_size,
                page_stride,
                flat.seq_lens.shape[0],
                flat.page_table.stride(0),
                len(self.layers),
                torch.get_num_threads(),
            ],
            dtype=torch.int64,
        )
        call = self._lib.pdr_decode_layers_bf16 if self.bf16 else self._lib.pdr_decode_layers_f32
        rc = call(
            self._table.data_ptr(),
            dims.data_ptr(),
            x0.data_ptr(),
            residual.data_ptr(),
            out.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            pages.data_ptr(),
            offsets.data_ptr(),
            flat.page_table.data_ptr(),
            flat.seq_lens.data_ptr(),
            flat.token_idx.data_ptr(),
            self.eps,
            self.scale,
        )
        if rc == -1:
            raise IndexError(f"a K/V slot lies outside the cache of {num_pages} x {page_size} slots")
        if rc == -2:
            raise ValueError(
                f"native decode attention does not take heads {self.heads} / kv_heads {self.kv_heads}, head_dim "
                f"{self.head_dim}, page_size {page_size}; use --attention-backend torch"
            )
        if rc == -4:
            raise RuntimeError("the bf16 GEMM needs a CPU with avx512_bf16; use --dtype float32 on this host")
        if rc != 0:
            raise MemoryError("the fused decode call could not allocate its scratch")
        return out, residual
