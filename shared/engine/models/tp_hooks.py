"""The collectives a tensor-parallel rank's layers call (shared/engine/parallel/comm.py implements them).

A protocol here, so the models never import the parallel package (which imports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class TPComm(Protocol):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial x (a row-parallel projection's output)."""
        ...

    def embed(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, hidden] from a table of this rank's vocab rows."""
        ...

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, this rank's vocab rows] -> [n, vocab]."""
        ...
