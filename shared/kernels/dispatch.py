"""Attention backend selection: the model calls one backend object; which kernels run is decided here, from the
device and the configured `attention_backend`, once, when the runner is built (never from global state).

A step's batch may mix decode tokens (one new token per sequence) and extend sequences (prefill chunks). The
backend's `prepare` plans the step once (attention_plan.py): decode tokens go to the batched paged decode kernel
in groups of similar length, extend sequences to the per-sequence extend kernel.

Backends: torch (the reference ops, any CPU), native (C decode and extend kernels that read the pages in place; CPU,
fp32 q over an fp32 or bf16 cache, the CPU default), triton (GPU; interpreted on CPU for tests).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from shared.kernels.attention_plan import AttentionMetadata, DecodeGroup, plan_attention
from shared.kernels.decode_attention import GatherWorkspace, paged_decode_attention
from shared.kernels.extend_attention import extend_attention
from shared.kernels.native.build import native_available
from shared.kernels.native.gemm import bf16_kernels
from shared.kernels.native.paged_decode import native_paged_decode
from shared.kernels.native.paged_extend import native_paged_extend
from shared.kernels.window_attention import needs_window_path, window_attention

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "DecodeGroup",
    "NativeAttentionBackend",
    "TorchAttentionBackend",
    "select_attention_backend",
    "sequence_token_starts",
]

log = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("auto", "torch", "native", "triton")


class AttentionBackend(Protocol):
    name: str

    def prepare(
        self,
        page_table: torch.Tensor,
        prefix_lens: np.ndarray,
        extend_lens: np.ndarray,
        token_starts: np.ndarray,
        page_size: int,
    ) -> AttentionMetadata: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """window: the layer's sliding window (0: full); softcap: its score soft-capping (0: none); sinks: its
        per-head sink logits [heads] (gpt-oss; None: none). Layers with any go through window_attention.py on every
        backend (that module says why)."""
        ...


class TorchAttentionBackend:
    """Reference kernels in plain torch; the CPU path."""

    name = "torch"
    flat_decode = False  # plan decode tokens in length groups (the gather pads each group to its longest)

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype  # of q/k/v; decode masks are built in it
        self._workspace = GatherWorkspace()

    def prepare(
        self,
        page_table: torch.Tensor,
        prefix_lens: np.ndarray,
        extend_lens: np.ndarray,
        token_starts: np.ndarray,
        page_size: int,
    ) -> AttentionMetadata:
        """page_table [bs, max_pages]; prefix_lens, extend_lens, token_starts: [bs] int64 numpy (CPU-side plan)."""
        return plan_attention(
            page_table, prefix_lens, extend_lens, token_starts, page_size, self.dtype, flat_decode=self.flat_decode
        )

    @staticmethod
    def _extend(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """The extend sequences' rows of the output (the other rows left unset, for the decode path to fill)."""
        if not meta.extend_rows:
            return torch.empty_like(q)
        return extend_attention(
            q,
            k,
            v,
            k_cache,
            v_cache,
            meta.page_table,
            meta.extend_prefix_lens,
            meta.extend_lens,
            scale,
            rows=meta.extend_rows,
            token_starts=meta.extend_token_starts,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [T, heads, d], k/v [T, kv_heads, d] (already written to the cache) -> [T, heads, d]."""
        if needs_window_path(meta, window, softcap, sinks):
            return window_attention(q, k_cache, v_cache, meta, scale, window, softcap, sinks)
        if meta.all_decode:
            g = meta.decode_groups[0]
            return paged_decode_attention(
                q, k_cache, v_cache, g.page_table, g.seq_lens, scale, mask=g.mask, workspace=self._workspace
            )
        out = self._extend(q, k, v, k_cache, v_cache, meta, scale)
        for g in meta.decode_groups:
            assert g.token_idx is not None
            dec = paged_decode_attention(
                q.index_select(0, g.token_idx),
                k_cache,
                v_cache,
                g.page_table,
                g.seq_lens,
                scale,
                mask=g.mask,
                workspace=self._workspace,
            )
            out.index_copy_(0, g.token_idx, dec)
        return out


class NativeAttentionBackend(TorchAttentionBackend):
    """The C kernels of shared/kernels/native, reading each sequence's pages in place where the reference gathers
    them into a padded copy first: decode tokens (all of a step's, in one call per layer; 2.2-2.5x the reference
    over 30 layers at 16 sequences of 100-760 tokens, fp32, 2 threads) and extend sequences (all of a step's in one
    call; 2.2-2.6x torch's SDPA at 4 x 128 and 1 x 512 new tokens, more with a cached prefix, which the reference
    gathers and masks)."""

    name = "native"
    flat_decode = True  # all decode tokens in one FlatDecode: the kernel reads each sequence's own length

    @staticmethod
    def _extend(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """The extend rows of the output; k and v are unused (the new tokens' K/V are in the cache already)."""
        out = torch.empty_like(q)
        if not meta.extend_rows:
            return out
        rows = meta.extend_rows
        pt = meta.page_table
        if len(rows) != pt.shape[0] or rows != tuple(range(len(rows))):
            pt = pt.index_select(0, torch.tensor(rows, dtype=torch.int64, device=pt.device))
        native_paged_extend(
            q.contiguous(),
            k_cache,
            v_cache,
            pt.contiguous(),
            meta.extend_token_starts,
            meta.extend_prefix_lens,
            meta.extend_lens,
            scale,
            out,
        )
        return out

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if needs_window_path(meta, window, softcap, sinks):  # the C kernels take neither (window_attention.py)
            return window_attention(q, k_cache, v_cache, meta, scale, window, softcap, sinks)
        flat = meta.flat_decode
        out = self._extend(q, k, v, k_cache, v_cache, meta, scale)
        if flat is not None:
            native_paged_decode(
                q.contiguous(), k_cache, v_cache, flat.page_table, flat.seq_lens, flat.token_idx, scale, out
            )
        return out


def select_attention_backend(
    name: str, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> AttentionBackend:
    """'auto' | 'torch' | 'triton' on a device, for q/k/v of `dtype` -> a backend instance (one per model runner).

    auto: the Triton kernels on CUDA, native on CPU for fp32 where a C compiler can build it, and for bf16 where the
    CPU also runs the bf16 kernels (avx512_bf16) (else the torch reference ops, with a warning saying why). 'native'
    asked for explicitly must build. 'triton' on CPU runs the same kernels under Triton's interpreter: for tests, far
    slower than 'torch'.

    The native backend takes fp32 q (a bf16 model's native path keeps its activations in fp32, models/llama.py's
    act_dtype) over a cache of the model's dtype; its `dtype` is fp32 either way.
    """
    dev = torch.device(device)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend {name!r} is unknown; use one of: {', '.join(ATTENTION_BACKENDS)}")
    native_dtypes = (torch.float32, torch.bfloat16)
    if name == "auto":
        name = "triton" if dev.type == "cuda" else "native" if dtype in native_dtypes else "torch"
        if name == "native":
            ok, why = native_available()
            if ok and dtype == torch.bfloat16 and not bf16_kernels():
                ok, why = False, "no avx512_bf16 for the bf16 kernels"
            if not ok:
                log.warning("native CPU attention unavailable (%s); using the torch reference ops", why)
                name = "torch"
    if name == "native":
        if dev.type != "cpu" or dtype not in native_dtypes:
            raise ValueError(
                f"attention_backend 'native' runs fp32 or bf16 on cpu, not {dtype} on {dev.type}; "
                "use --attention-backend torch"
            )
        ok, why = native_available()
        if not ok:
            raise ValueError(f"attention_backend 'native' is unavailable: {why}; use --attention-backend torch")
        return NativeAttentionBackend(torch.float32)
    if name == "triton":
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(
                f"attention_backend 'triton' runs on cuda (or cpu, interpreted), not {dev.type}; "
                "use --attention-backend torch"
            )
        # imported here: a torch-backend worker never pays for loading triton
        from shared.kernels.triton.backend import TritonAttentionBackend

        return TritonAttentionBackend(dtype)
    return TorchAttentionBackend(dtype)


def sequence_token_starts(extend_lens: Sequence[int]) -> np.ndarray:
    """[bs] index of each sequence's first token in the flat batch."""
    lens = np.asarray(extend_lens, dtype=np.int64)
    return np.cumsum(lens) - lens
