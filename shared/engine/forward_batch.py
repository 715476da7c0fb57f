"""SchedulerOutput -> flat tensors for one forward.

Built with numpy over whole arrays (one np.fromiter per field, one torch tensor each at the end), with a Python
loop over sequences only where a sequence's variable-length page list is copied into the page table; never a
loop over tokens. This is on the per-step critical path the engine benchmark measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from shared.engine.types import ScheduledSeq, SchedulerOutput


@dataclass(frozen=True)
class ForwardBatch:
    """One step's tokens, flat over all sequences (T tokens, bs sequences, n of them need logits)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    page_table: torch.Tensor  # [bs, max_pages] int64; padded with page 0 past each sequence's last page
    out_pages: torch.Tensor  # [T] int64: page where token t's K/V goes
    out_offsets: torch.Tensor  # [T] int64: slot within that page
    logits_indices: torch.Tensor  # [n] int64: last token of each sequence with need_logits, in seqs order
    # CPU-side copies of the per-sequence plan (the attention backend splits decode from extend with these)
    prefix_lens: np.ndarray  # [bs] int64: start_pos, tokens already cached
    extend_lens: np.ndarray  # [bs] int64: tokens computed now
    token_starts: np.ndarray  # [bs] int64: first token of each sequence in the flat batch
    page_size: int
    # Multimodal prefill: rows of the flat batch whose input embedding is given (image placeholders) and the
    # embeddings themselves; None when no sequence of the step carries any (every decode step).
    embed_rows: torch.Tensor | None = None  # [M] int64
    embed_values: torch.Tensor | None = None  # [M, hidden]
    # prompt logprobs: logits_indices ends with this many chunk rows (so it is no identity even when it has T rows)
    num_prompt_rows: int = 0

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.extend_lens.shape[0])

    @property
    def seq_lens(self) -> np.ndarray:
        return self.prefix_lens + self.extend_lens

    @property
    def is_decode(self) -> bool:
        return bool((self.extend_lens == 1).all())


def build_forward_batch(
    out: SchedulerOutput,
    page_size: int,
    device: torch.device | str = "cpu",
    *,
    num_pages: int | None = None,
    vocab_size: int | None = None,
    max_positions: int | None = None,
) -> ForwardBatch:
    """Flatten a SchedulerOutput. The optional bounds turn scheduler bugs into clear errors instead of garbage.

    Raises ValueError for an empty sequence, too few pages for a sequence's positions, a page id outside the pool,
    a token id outside the vocabulary or a position past max_positions.
    """
    seqs = out.seqs
    if not seqs:
        raise ValueError("build_forward_batch needs at least one sequence; an empty SchedulerOutput means no step")
    ext, start = _chunk_extents(seqs)
    seq_lens = start + ext
    cu = np.cumsum(ext)
    token_starts = cu - ext
    total = int(cu[-1])
    ids = np.fromiter(chain.from_iterable(s.token_ids for s in seqs), np.int64, total)
    # position of token t = start[seq] + (t - token_starts[seq])
    positions = np.arange(total, dtype=np.int64) + np.repeat(start - token_starts, ext)
    page_table = _page_table(seqs, seq_lens, page_size)
    seq_of_tok = np.repeat(np.arange(len(seqs)), ext)
    out_pages = page_table[seq_of_tok, positions // page_size]
    out_offsets = positions % page_size
    _check_bounds(seqs, page_table, ids, seq_lens, num_pages, vocab_size, max_positions)
    logits_idx, num_prompt_rows = _logits_indices(seqs, token_starts, cu)

    dev = torch.device(device)

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    embed_rows = embed_values = None
    if any(s.embeds for s in seqs):
        rows, values = _embeddings(seqs, ext, token_starts)
        embed_rows = t(rows)
        embed_values = values.to(dev)

    return ForwardBatch(
        input_ids=t(ids),
        positions=t(positions),
        page_table=t(page_table),
        out_pages=t(out_pages),
        out_offsets=t(out_offsets),
        logits_indices=t(logits_idx),
        prefix_lens=start,
        extend_lens=ext,
        token_starts=token_starts,
        page_size=page_size,
        embed_rows=embed_rows,
        embed_values=embed_values,
        num_prompt_rows=num_prompt_rows,
    )


def _chunk_extents(seqs: Sequence[ScheduledSeq]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens computed now, tokens already cached) per sequence, each [bs] int64; both checked."""
    bs = len(seqs)
    ext = np.fromiter((len(s.token_ids) for s in seqs), np.int64, bs)
    start = np.fromiter((s.start_pos for s in seqs), np.int64, bs)
    if (ext < 1).any():
        bad = seqs[int(np.argmin(ext))]
        raise ValueError(f"request {bad.req_id} was scheduled with no tokens; schedule at least one token")
    if (start < 0).any():
        bad = seqs[int(np.argmin(start))]
        raise ValueError(f"request {bad.req_id} has start_pos {bad.start_pos}; it must be >= 0")
    return ext, start


def _page_table(seqs: Sequence[ScheduledSeq], seq_lens: np.ndarray, page_size: int) -> np.ndarray:
    """[bs, max_pages] int64: each sequence's pages up to the end of its chunk, padded with page 0."""
    npages = -(-seq_lens // page_size)
    have = np.fromiter((len(s.page_ids) for s in seqs), np.int64, len(seqs))
    if (have < npages).any():
        i = int(np.argmax(have < npages))
        raise ValueError(
            f"request {seqs[i].req_id} needs {npages[i]} pages for {seq_lens[i]} tokens at page_size {page_size} "
            f"but was given {have[i]}; the scheduler must allocate pages up to the end of the chunk"
        )
    page_table = np.zeros((len(seqs), int(npages.max())), np.int64)
    for i, s in enumerate(seqs):  # a sequence's page list has its own length: the one loop over sequences
        n = int(npages[i])
        page_table[i, :n] = s.page_ids[:n]
    return page_table


def _check_bounds(
    seqs: Sequence[ScheduledSeq],
    page_table: np.ndarray,
    ids: np.ndarray,
    seq_lens: np.ndarray,
    num_pages: int | None,
    vocab_size: int | None,
    max_positions: int | None,
) -> None:
    """The optional bounds of build_forward_batch: page ids in the pool, token ids in the vocabulary, context."""
    if num_pages is not None and (page_table.max() >= num_pages or page_table.min() < 0):
        raise ValueError(f"a page id is outside the KV pool [0, {num_pages}); page table: {page_table.tolist()}")
    if vocab_size is not None and (ids.max() >= vocab_size or ids.min() < 0):
        raise ValueError(
            f"token id {int(ids.max()) if ids.max() >= vocab_size else int(ids.min())} is outside "
            f"the vocabulary [0, {vocab_size})"
        )
    if max_positions is not None and int(seq_lens.max()) > max_positions:
        i = int(np.argmax(seq_lens))
        raise ValueError(
            f"request {seqs[i].req_id} reaches {seq_lens[i]} tokens, past the context length {max_positions}"
        )


def _logits_indices(seqs: Sequence[ScheduledSeq], token_starts: np.ndarray, cu: np.ndarray) -> tuple[np.ndarray, int]:
    """([n] int64 rows that need logits, how many of them are prompt-logprob rows at the end)."""
    need = np.fromiter((s.need_logits for s in seqs), bool, len(seqs))
    logits_idx = (cu - 1)[need]
    if not any(s.prompt_logits for s in seqs):
        return logits_idx, 0
    # prompt logprobs: the chunk's other rows follow the sampling rows
    extra = [np.arange(token_starts[i], cu[i] - int(s.need_logits)) for i, s in enumerate(seqs) if s.prompt_logits]
    return np.concatenate([logits_idx, *extra]).astype(np.int64), sum(len(e) for e in extra)


def _embeddings(
    seqs: Sequence[ScheduledSeq], ext: np.ndarray, token_starts: np.ndarray
) -> tuple[np.ndarray, torch.Tensor]:
    """([M] int64 flat-batch rows, [M, hidden] embeddings) of the multimodal placeholders in this step."""
    rows: list[np.ndarray] = []
    values: list[torch.Tensor] = []
    for i, s in enumerate(seqs):
        for e in s.embeds:
            n = int(e.values.shape[0])
            if e.offset < 0 or e.offset + n > ext[i]:
                raise ValueError(
                    f"request {s.req_id}: embeddings for chunk rows [{e.offset}, {e.offset + n}) "
                    f"but the chunk has {ext[i]} tokens"
                )
            rows.append(np.arange(n, dtype=np.int64) + token_starts[i] + e.offset)
            values.append(e.values)
    return np.concatenate(rows), torch.cat(values)
