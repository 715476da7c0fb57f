"""The runner contract: what the engine needs of whatever runs the model (ModelRunner; MockRunner for scale tests).

A step is two calls, so the engine times batching apart from compute: `prepare(out)` turns the scheduler's output
into the runner's batch (validated against the pool, the vocabulary and the context length), `forward_batch`
computes it and returns float32 logits [seqs with need_logits, vocab]. A runner whose step is one call inherits
`OneCallStep`. Capabilities are attributes, not probed: `max_batch_tokens` (None: no limit) bounds a step, and
`can_copy_pages` says whether `kv.copy_pages` exists (n > 1 forks copy a prompt's partial last page; without it a
fork prefills from the prefix cache).

`kv` is the pool hand-offs and the kvstore read and write, in the layout every TP size shares (all KV heads). A
runner whose model computes in that very pool (`OwnPool`) has nothing to do around them; a tensor-parallel one
(shared/engine/parallel/runner.py) gathers its ranks' heads into `kv` before pages leave (`export_pages`) and
scatters them back after pages arrive (`import_pages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from shared.engine.kv_pool import KVPool
    from shared.engine.types import SchedulerOutput
    from shared.modelspec.kv_layout import KVLayout


class Runner(Protocol):
    num_pages: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    context_length: int
    layout: KVLayout
    kv: KVPool  # the pages the hand-off and the kvstore read and write
    device: torch.device

    @property
    def max_batch_tokens(self) -> int | None:
        """Most tokens one step may hold (None: no limit)."""
        ...

    @property
    def can_copy_pages(self) -> bool:
        """kv.copy_pages exists."""
        ...

    def prepare(self, out: SchedulerOutput) -> Any: ...

    def forward_batch(self, batch: Any) -> torch.Tensor: ...

    def export_pages(self, page_ids: Sequence[int]) -> None:
        """Before a hand-off or a kvstore save reads `kv`'s pages `page_ids`: make them hold the model's KV."""
        ...

    def import_pages(self, page_ids: Sequence[int]) -> None:
        """After a hand-off or a kvstore load wrote `kv`'s pages `page_ids`: make the model read them."""
        ...


class OwnPool:
    """export_pages / import_pages of a runner whose model reads and writes `kv` itself: nothing to move."""

    def export_pages(self, page_ids: Sequence[int]) -> None:
        return None

    def import_pages(self, page_ids: Sequence[int]) -> None:
        return None


class OneCallStep(OwnPool):
    """prepare / forward_batch for a runner whose step is its one `forward(out)` call."""

    def forward(self, out: SchedulerOutput) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, out: SchedulerOutput) -> SchedulerOutput:
        return out

    def forward_batch(self, batch: SchedulerOutput) -> torch.Tensor:
        return self.forward(batch)
