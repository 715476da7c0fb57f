"""TritonAttentionBackend: the AttentionBackend protocol (shared.kernels.dispatch) over the Triton kernels.

Plans are simpler than the torch backend's: the decode kernel walks each sequence's own pages to its own length,
so an all-decode step is one launch over the whole batch (no length groups, no masks), and any other step is one
extend launch over every sequence (a decode token is an extend of length 1). Chosen by select_attention_backend
for 'triton' (and for 'auto' on CUDA); on CPU tensors the same kernels run under Triton's interpreter, which is
for tests: it is orders of magnitude slower than the torch backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shared.kernels.attention_plan import AttentionMetadata, DecodeGroup
from shared.kernels.triton.decode_attention import paged_decode_attention
from shared.kernels.triton.extend_attention import extend_attention
from shared.kernels.window_attention import needs_window_path, window_attention

__all__ = ["TritonAttentionBackend", "TritonAttentionMetadata"]


@dataclass(frozen=True)
class TritonAttentionMetadata(AttentionMetadata):
    """A step that is not all-decode: every sequence goes through the extend kernel, so extend_* list all of them
    (decode tokens included) and decode_groups is empty. The same per-sequence values as device tensors:"""

    ext_rows: torch.Tensor  # [bs] int64: page_table row of each sequence
    ext_token_starts: torch.Tensor  # [bs] int64: first token in the flat batch
    ext_prefix_lens: torch.Tensor  # [bs] int64: tokens already cached
    ext_lens: torch.Tensor  # [bs] int64: tokens computed now
    max_extend_len: int


class TritonAttentionBackend:
    """Triton paged decode + extend kernels; the GPU path. One instance per model runner."""

    name = "triton"

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype  # of q/k/v

    def prepare(
        self,
        page_table: torch.Tensor,
        prefix_lens: np.ndarray,
        extend_lens: np.ndarray,
        token_starts: np.ndarray,
        page_size: int,
    ) -> AttentionMetadata:
        """page_table [bs, max_pages] (on the device); prefix_lens, extend_lens, token_starts: [bs] int64 numpy."""
        dev = page_table.device
        if bool((extend_lens == 1).all()):
            return self.decode_metadata(page_table, torch.from_numpy(prefix_lens + 1).to(dev), page_size)
        bs = len(extend_lens)
        rows = np.arange(bs, dtype=np.int64)
        # [4, bs] in one host -> device copy instead of four
        info = torch.from_numpy(np.stack((rows, token_starts, prefix_lens, extend_lens)).astype(np.int64)).to(dev)
        return TritonAttentionMetadata(
            page_table=page_table,
            decode_groups=(),
            extend_rows=tuple(rows.tolist()),
            extend_token_starts=tuple(token_starts.tolist()),
            extend_prefix_lens=tuple(prefix_lens.tolist()),
            extend_lens=tuple(extend_lens.tolist()),
            ext_rows=info[0],
            ext_token_starts=info[1],
            ext_prefix_lens=info[2],
            ext_lens=info[3],
            max_extend_len=int(extend_lens.max()),
        )

    def decode_metadata(self, page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> AttentionMetadata:
        """The plan of an all-decode step from device tensors alone: no host sync, no device work, so the
        CUDA-graph runner builds it over its static buffers. page_table [bs, max_pages]; seq_lens [bs] >= 1."""
        no_mask = torch.empty(0, dtype=self.dtype, device=page_table.device)  # the kernel masks by seq_lens itself
        group = DecodeGroup(token_idx=None, page_table=page_table, seq_lens=seq_lens, mask=no_mask)
        return AttentionMetadata(
            page_table=page_table,
            decode_groups=(group,),
            extend_rows=(),
            extend_token_starts=(),
            extend_prefix_lens=(),
            extend_lens=(),
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
        """q [T, heads, d], k/v [T, kv_heads, d] (already written to the cache, which the kernels read them from)
        -> [T, heads, d]. Windowed or soft-capped layers take the torch path (window_attention.py says why)."""
        if needs_window_path(meta, window, softcap, sinks):
            return window_attention(q, k_cache, v_cache, meta, scale, window, softcap, sinks)
        if meta.all_decode:
            g = meta.decode_groups[0]
            return paged_decode_attention(q, k_cache, v_cache, g.page_table, g.seq_lens, scale)
        if not isinstance(meta, TritonAttentionMetadata):
            raise TypeError(
                "this step was planned by another attention backend; plan it with TritonAttentionBackend.prepare"
            )
        return extend_attention(
            q,
            k_cache,
            v_cache,
            meta.page_table,
            meta.ext_rows,
            meta.ext_token_starts,
            meta.ext_prefix_lens,
            meta.ext_lens,
            scale,
            max_extend_len=meta.max_extend_len,
        )
