"""The per-step token bitmask of constrained requests, filled on a helper thread while the forward pass runs.

Each matcher already accepted its request's last token in the previous step's update, so the mask for this step's
sampling is known before the forward pass starts (xgrammar's intended overlap): `start` submits the fill, the
engine runs the model, `apply` waits (usually it is long done) and sets disallowed logits to -inf in one op over the
constrained rows. Requests without a grammar share the batch and are skipped (indices), so mixing them costs nothing
per unconstrained row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from shared.engine.request import Request


@dataclass
class PendingMask:
    rows: list[int]  # logits rows that are constrained
    bitmask: torch.Tensor  # [len(reqs), ceil(V / 32)] int32
    done: Future[None]
    grammars: list  # the rows' RequestGrammar, in rows order


@dataclass
class MaskStats:
    """Cumulative timings of the masks (seconds), for benchmarks: how much of the grammar work the step waited for.
    The fill normally overlaps the forward pass; wait_s + inline fills + apply_s is what lies on the step's path."""

    steps: int = 0  # steps with at least one constrained row
    rows: int = 0  # constrained rows masked
    fill_s: float = 0.0  # filling bitmask rows (helper thread, or inline when it had not started)
    inline_fill_s: float = 0.0  # the part of fill_s done by the engine's own thread
    wait_s: float = 0.0  # apply() waiting for the helper thread after the forward pass
    apply_s: float = 0.0  # setting the disallowed logits to -inf

    @property
    def critical_s(self) -> float:
        return self.wait_s + self.inline_fill_s + self.apply_s


class MaskFiller:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._pool: ThreadPoolExecutor | None = None
        self._buf: torch.Tensor | None = None
        self.stats = MaskStats()

    def start(self, reqs: Sequence[Request]) -> PendingMask | None:
        """reqs: the requests of this step's logits rows, in row order. None when no row is constrained."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return None
        import xgrammar as xgr

        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="pdrelay-grammar")
        if self._buf is None or self._buf.shape[0] < len(reqs):
            self._buf = xgr.allocate_token_bitmask(max(len(reqs), 16), self.vocab_size)
        bitmask = self._buf
        grammars = [reqs[i].grammar for i in rows]
        stats = self.stats

        def fill() -> None:
            t0 = time.perf_counter()
            for i, g in zip(rows, grammars, strict=True):
                g.fill(bitmask, i)  # type: ignore[union-attr]  # rows: the requests that have a grammar
            stats.fill_s += time.perf_counter() - t0

        return PendingMask(rows, bitmask, self._pool.submit(fill), grammars)

    def apply(self, pending: PendingMask, logits: torch.Tensor) -> None:
        """logits: [B, V] float32, modified in place (rows not in pending.rows are left alone)."""
        import xgrammar as xgr

        stats = self.stats
        t0 = time.perf_counter()
        if pending.done.cancel():
            # The helper thread never got to it (a busy machine schedules it late): fill here rather than wait for
            # a thread wake-up; the fill itself costs tens of microseconds per row.
            for i, g in zip(pending.rows, pending.grammars, strict=True):
                g.fill(pending.bitmask, i)
            stats.inline_fill_s += time.perf_counter() - t0
            stats.fill_s += time.perf_counter() - t0
        else:
            pending.done.result()
            stats.wait_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        xgr.apply_token_bitmask_inplace(
            logits, pending.bitmask.to(logits.device), vocab_size=self.vocab_size, indices=pending.rows
        )
        stats.apply_s += time.perf_counter() - t1
        stats.steps += 1
        stats.rows += len(pending.rows)

    def apply_row(self, pending: PendingMask, logits: torch.Tensor, row: int) -> None:
        """The mask of one constrained row onto its logits alone ([1, V], in place): the batch's sampling failed,
        so each row is filled and masked by itself and a failure stays with its request."""
        import xgrammar as xgr

        if not pending.done.cancel():
            pending.done.exception()  # wait for the helper thread; what failed there is redone for this row below
        g = pending.grammars[pending.rows.index(row)]
        g.fill(pending.bitmask, row)
        xgr.apply_token_bitmask_inplace(
            logits, pending.bitmask[row : row + 1].to(logits.device), vocab_size=self.vocab_size
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
