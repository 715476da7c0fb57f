"""The per-step attention plan: which tokens take the batched paged-decode path (in length groups) and which
sequences take the per-sequence extend path. Built once per step on the CPU; every layer reuses it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from shared.kernels.decode_attention import decode_mask

# At most this many decode groups per step: each group costs two gathers and one attention call per layer.
MAX_DECODE_GROUPS = 4


@dataclass(frozen=True)
class DecodeGroup:
    """Decode sequences attended together: their keys are gathered into one [n, max_len] batch, so a group holds
    sequences of similar length (a 700-token sequence would otherwise make fifteen 100-token ones pad to 700)."""

    token_idx: torch.Tensor | None  # [n] their tokens in the flat batch; None: the whole batch, in order
    page_table: torch.Tensor  # [n, group_max_pages] int64
    seq_lens: torch.Tensor  # [n] int64, including the new token
    mask: torch.Tensor  # [n, 1, 1, group_max_pages * page_size] additive, in the attention dtype


@dataclass(frozen=True)
class FlatDecode:
    """All decode sequences of a step for a kernel that reads pages in place (no gather, so no length groups)."""

    token_idx: torch.Tensor  # [n] int64, their tokens in the flat batch
    page_table: torch.Tensor  # [n, max_pages] int64, contiguous
    seq_lens: torch.Tensor  # [n] int64, including the new token


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step attention plan.

    decode_groups: the sequences computing exactly one new token (whatever their prefix), grouped by length;
    or, when planned flat, none and flat_decode holds them all.
    extend_*: the other sequences, as parallel tuples: row in page_table, first token index, prefix, new tokens.
    """

    page_table: torch.Tensor  # [bs, max_pages] int64
    decode_groups: tuple[DecodeGroup, ...]
    extend_rows: tuple[int, ...]
    extend_token_starts: tuple[int, ...]
    extend_prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    flat_decode: FlatDecode | None = field(default=None, kw_only=True)  # keyword-only: subclasses add fields

    @functools.cached_property
    def max_seq_len(self) -> int:
        """The step's longest sequence, cached tokens and new ones (once per step, on first use): a layer whose
        sliding window covers it attends exactly as a full layer does, on the fast kernels."""
        longest = max((p + n for p, n in zip(self.extend_prefix_lens, self.extend_lens)), default=0)
        if self.flat_decode is not None and self.flat_decode.seq_lens.numel():
            longest = max(longest, int(self.flat_decode.seq_lens.max().item()))
        for g in self.decode_groups:
            longest = max(longest, int(g.seq_lens.max().item()))
        return longest

    @property
    def all_decode(self) -> bool:
        """One decode group covering the whole batch: q goes to the kernel as is."""
        return len(self.decode_groups) == 1 and self.decode_groups[0].token_idx is None


def length_groups(pages: np.ndarray, max_groups: int = MAX_DECODE_GROUPS) -> list[np.ndarray]:
    """Split sequences (pages needed by each, [n]) into groups of similar length; returns index arrays.

    Longest first; a sequence needing at most half the pages of its group's longest starts a new group, so no
    group gathers more than ~2x the keys it needs; past max_groups the rest join the last group.
    """
    order = np.argsort(-pages, kind="stable")
    groups: list[list[int]] = []
    top = 0
    for i in order.tolist():
        if not groups or (2 * pages[i] <= top and len(groups) < max_groups):
            groups.append([i])
            top = int(pages[i])
        else:
            groups[-1].append(i)
    return [np.sort(np.asarray(g, dtype=np.int64)) for g in groups]


def plan_attention(
    page_table: torch.Tensor,
    prefix_lens: np.ndarray,
    extend_lens: np.ndarray,
    token_starts: np.ndarray,
    page_size: int,
    dtype: torch.dtype,
    *,
    flat_decode: bool = False,
) -> AttentionMetadata:
    """page_table [bs, max_pages] (on the device); prefix_lens, extend_lens, token_starts: [bs] int64 numpy.

    flat_decode: put every decode sequence in one FlatDecode instead of length groups."""
    dev = page_table.device
    bs = len(extend_lens)
    is_dec = extend_lens == 1
    dec_rows = np.nonzero(is_dec)[0]
    groups: list[DecodeGroup] = []
    flat: FlatDecode | None = None
    if len(dec_rows) and flat_decode:
        seq_lens = prefix_lens[dec_rows] + 1
        max_pages = int(-(-seq_lens.max() // page_size))
        rows_t = torch.from_numpy(dec_rows.astype(np.int64)).to(dev)
        pt = page_table if len(dec_rows) == bs else page_table.index_select(0, rows_t)
        flat = FlatDecode(
            torch.from_numpy(np.ascontiguousarray(token_starts[dec_rows], dtype=np.int64)).to(dev),
            pt[:, :max_pages].contiguous(),
            torch.from_numpy(seq_lens.astype(np.int64)).to(dev),
        )
    elif len(dec_rows):
        seq_lens = prefix_lens[dec_rows] + 1
        pages = -(-seq_lens // page_size)
        for g in length_groups(pages):
            max_pages = int(pages[g].max())
            if len(g) == bs:  # the whole batch, in order: no index ops at all
                pt, tok = page_table[:, :max_pages], None
            else:
                rows = dec_rows[g]
                pt = page_table.index_select(0, torch.from_numpy(rows).to(dev))[:, :max_pages]
                tok = torch.from_numpy(token_starts[rows]).to(dev)
            lens = torch.from_numpy(seq_lens[g]).to(dev)
            groups.append(DecodeGroup(tok, pt, lens, decode_mask(lens, max_pages * page_size, dtype)))
    ext = np.nonzero(~is_dec)[0]
    return AttentionMetadata(
        page_table=page_table,
        decode_groups=tuple(groups),
        extend_rows=tuple(ext.tolist()),
        extend_token_starts=tuple(token_starts[ext].tolist()),
        extend_prefix_lens=tuple(prefix_lens[ext].tolist()),
        extend_lens=tuple(extend_lens[ext].tolist()),
        flat_decode=flat,
    )
