"""Attention backend selection: the model calls one backend object; which kernels run is decided here, from the
device and the configured `attention_backend`, once, when the runner is built (never from global state).

A step's batch may mix decode tokens (one new token per sequence) and extend sequences (prefill chunks). The
backend's `prepare` splits the batch once per step into metadata every layer reuses: decode tokens go to the
batched paged decode kernel, extend sequences to the per-sequence extend kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from shared.kernels.decode_attention import GatherWorkspace, decode_mask, paged_decode_attention
from shared.kernels.extend_attention import extend_attention

ATTENTION_BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step attention plan, shared by all layers.

    decode_*: the sequences computing exactly one new token (whatever their prefix); their tokens sit at
    decode_token_idx [n_dec] in the flat batch (None when the whole batch is decode: the tokens are then q itself).
    extend_*: the other sequences, as parallel tuples: row in page_table, first token index, prefix, new tokens.
    """

    page_table: torch.Tensor  # [bs, max_pages] int64
    decode_token_idx: torch.Tensor | None
    decode_page_table: torch.Tensor | None  # [n_dec, dec_max_pages]
    decode_seq_lens: torch.Tensor | None  # [n_dec]
    decode_mask: torch.Tensor | None  # [n_dec, 1, 1, dec_max_pages * page_size]
    extend_rows: tuple[int, ...]
    extend_token_starts: tuple[int, ...]
    extend_prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]

    @property
    def all_decode(self) -> bool:
        return self.decode_page_table is not None and self.decode_token_idx is None


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
    ) -> torch.Tensor: ...


class TorchAttentionBackend:
    """Reference kernels in plain torch; the CPU path."""

    name = "torch"

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype  # of q/k/v; the decode mask is built in it
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
        is_dec = extend_lens == 1
        n_dec = int(is_dec.sum())
        bs = len(extend_lens)
        dec_idx = dec_pt = dec_lens = dec_mask = None
        if n_dec:
            seq_lens = prefix_lens[is_dec] + 1
            max_pages = int(-(-seq_lens.max() // page_size))
            dev = page_table.device
            if n_dec == bs:
                dec_pt = page_table[:, :max_pages]
            else:
                rows = torch.from_numpy(np.nonzero(is_dec)[0]).to(dev)
                dec_pt = page_table.index_select(0, rows)[:, :max_pages]
                dec_idx = torch.from_numpy(token_starts[is_dec]).to(dev)
            dec_lens = torch.from_numpy(seq_lens).to(dev)
            dec_mask = decode_mask(dec_lens, max_pages * page_size, self.dtype)
        ext = np.nonzero(~is_dec)[0]
        return AttentionMetadata(
            page_table=page_table,
            decode_token_idx=dec_idx,
            decode_page_table=dec_pt,
            decode_seq_lens=dec_lens,
            decode_mask=dec_mask,
            extend_rows=tuple(ext.tolist()),
            extend_token_starts=tuple(token_starts[ext].tolist()),
            extend_prefix_lens=tuple(prefix_lens[ext].tolist()),
            extend_lens=tuple(extend_lens[ext].tolist()),
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
    ) -> torch.Tensor:
        """q [T, heads, d], k/v [T, kv_heads, d] (already written to the cache) -> [T, heads, d]."""
        if meta.all_decode:
            assert meta.decode_page_table is not None and meta.decode_seq_lens is not None
            return paged_decode_attention(
                q, k_cache, v_cache, meta.decode_page_table, meta.decode_seq_lens, scale,
                mask=meta.decode_mask, workspace=self._workspace,
            )
        out = extend_attention(
            q, k, v, k_cache, v_cache, meta.page_table, meta.extend_prefix_lens, meta.extend_lens, scale,
            rows=meta.extend_rows, token_starts=meta.extend_token_starts,
        )
        if meta.decode_token_idx is not None:
            assert meta.decode_page_table is not None and meta.decode_seq_lens is not None
            dec = paged_decode_attention(
                q.index_select(0, meta.decode_token_idx), k_cache, v_cache, meta.decode_page_table,
                meta.decode_seq_lens, scale, mask=meta.decode_mask, workspace=self._workspace,
            )
            out.index_copy_(0, meta.decode_token_idx, dec)
        return out


def select_attention_backend(
    name: str, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> AttentionBackend:
    """'auto' | 'torch' | 'triton' on a device, for q/k/v of `dtype` -> a backend instance (one per model runner)."""
    dev = torch.device(device)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend {name!r} is unknown; use one of: {', '.join(ATTENTION_BACKENDS)}")
    if name == "auto":
        name = "torch"  # the Triton kernels land behind this same interface later; until then torch everywhere
    if name == "triton":
        raise ValueError(
            f"attention_backend 'triton' is not available yet (device {dev.type}); use --attention-backend torch"
        )
    return TorchAttentionBackend(dtype)


def sequence_token_starts(extend_lens: Sequence[int]) -> np.ndarray:
    """[bs] index of each sequence's first token in the flat batch."""
    lens = np.asarray(extend_lens, dtype=np.int64)
    return np.cumsum(lens) - lens
