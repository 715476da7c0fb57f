"""The collectives a sharded model calls: one all-reduce after attention's o projection and one after the MLP's
down projection (both row-parallel: each rank holds a partial sum), the vocab-parallel embedding, and the gather of
each rank's slice of the logits.

It imports nothing of the models, so llama.py can take it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass(frozen=True)
class GroupHandle:
    """This process's place in its tensor-parallel group: rank, size and the torch.distributed group the model's
    collectives run on (gloo on cpu, nccl on cuda)."""

    rank: int
    size: int
    group: dist.ProcessGroup | None


class TensorParallel:
    """Collectives of one rank; vocab rows [vocab_start, vocab_start + vocab_rows) of `vocab_size` live here."""

    def __init__(self, handle: GroupHandle, vocab_start: int, vocab_rows: int, vocab_size: int) -> None:
        self.rank, self.size, self.group = handle.rank, handle.size, handle.group
        self.vocab_start, self.vocab_rows, self.vocab_size = vocab_start, vocab_rows, vocab_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's partial `x` (in place)."""
        dist.all_reduce(x, group=self.group)
        return x

    def embed(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, hidden] from a table holding this rank's vocab rows: rows of other ranks' tokens are zero
        here, so the sum over ranks is exact (one rank contributes each row)."""
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_rows)
        out = F.embedding(local.masked_fill(outside, 0), table)
        out.masked_fill_(outside.unsqueeze(1), 0)
        return self.all_reduce(out)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, rows per rank] float32 -> [n, vocab_size]: every rank's slice side by side, the padding of the last
        rank's slice (vocabularies that do not split evenly) cut off."""
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)[:, : self.vocab_size]
