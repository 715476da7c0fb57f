"""Dynamic batching: embedding inputs of concurrent requests share one forward, grouped by length.

    submit(inputs)   queue a request's token id lists; resolves to its [n, dim] vectors
    the loop         waits up to `wait_s` (a few ms) for companions: after an idle spell until a batch is full, after
                     a forward until as many inputs are back as it computed; then the inputs that arrived (also
                     while the previous forward ran) are sorted by length and cut into batches of at most
                     `max_batch_size` inputs and `max_batch_tokens` tokens of attention grid (batch x longest: the
                     dense layers run packed, without padding, but attention pads each batch to its longest
                     input, so long inputs go together); each batch is one forward on the compute thread

One compute thread runs every forward, with this process's torch thread count set on it (OpenMP settings are
per thread). A request whose caller went away (its future cancelled) is dropped before its batch is formed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

EmbedFn = Callable[[Sequence[Sequence[int]]], torch.Tensor]
# (inputs in the batch, padded tokens, seconds of the forward)
BatchObserver = Callable[[int, int, float], None]


@dataclass
class _Request:
    inputs: list[list[int]]
    future: asyncio.Future[torch.Tensor]
    rows: list[torch.Tensor | None] = field(default_factory=list)
    left: int = 0


def plan_batches(lengths: Sequence[int], max_batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """Indices into `lengths`, grouped: shortest first, each group's `len * longest` within the token budget
    (a single input over the budget is a batch of its own). Pure, for tests."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        # sorted ascending: lengths[i] is the longest of cur + [i]
        if cur and (len(cur) >= max_batch_size or (len(cur) + 1) * lengths[i] > max_batch_tokens):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


class EmbedBatcher:
    def __init__(
        self,
        embed: EmbedFn,
        *,
        threads: int = 1,
        max_batch_size: int = 64,
        max_batch_tokens: int = 8192,
        wait_s: float = 0.002,
        on_batch: BatchObserver | None = None,
    ) -> None:
        if max_batch_size < 1 or max_batch_tokens < 1:
            raise ValueError(
                f"max_batch_size ({max_batch_size}) and max_batch_tokens ({max_batch_tokens}) must be >= 1"
            )
        self._embed = embed
        self.max_batch_size, self.max_batch_tokens, self.wait_s = max_batch_size, max_batch_tokens, wait_s
        self._on_batch = on_batch
        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix="encoder-compute", initializer=torch.set_num_threads, initargs=(max(1, threads),)
        )
        self._pending: list[_Request] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.queued_inputs = 0  # inputs waiting or computing (load reports)
        self.batches = 0

    def start(self) -> EmbedBatcher:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="encoder-batcher")
        return self

    async def submit(self, inputs: Sequence[Sequence[int]]) -> torch.Tensor:
        """[len(inputs), dim] vectors of one request's inputs (in order)."""
        assert self._task is not None, "start() the batcher first"
        if not inputs:
            raise ValueError("no inputs")
        fut: asyncio.Future[torch.Tensor] = asyncio.get_running_loop().create_future()
        req = _Request([list(x) for x in inputs], fut, [None] * len(inputs), len(inputs))
        self._pending.append(req)
        self.queued_inputs += len(inputs)
        self._wakeup.set()
        try:
            return await fut
        finally:
            if not fut.done():
                fut.cancel()

    async def run_sync(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the compute thread (warm-up, tests)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for req in self._pending:
            if not req.future.done():
                req.future.set_exception(RuntimeError("the encoder is shutting down"))
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        idle = True
        last = 0  # inputs of the previous round
        while True:
            if not self._pending:
                idle = True
                self._wakeup.clear()
                await self._wakeup.wait()
            if self.wait_s > 0:
                # Companions arriving within the window share the forward: after an idle spell, until the batch
                # is full; after a round, until as many inputs are back as it served (closed-loop clients send
                # their next request as soon as they have their answer).
                await self._gather(self.max_batch_size if idle else last)
            taken, self._pending = self._pending, []
            live = [r for r in taken if not r.future.done()]
            self.queued_inputs -= sum(len(r.inputs) for r in taken if r.future.done())
            if not live:
                continue
            idle = False
            last = sum(len(r.inputs) for r in live)
            await self._run(live)

    async def _gather(self, target: int) -> None:
        deadline = time.monotonic() + self.wait_s
        while sum(len(r.inputs) for r in self._pending) < target:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except TimeoutError:
                return

    async def _run(self, reqs: list[_Request]) -> None:
        flat = [(r, j) for r in reqs for j in range(len(r.inputs))]
        lengths = [len(r.inputs[j]) for r, j in flat]
        loop = asyncio.get_running_loop()
        for group in plan_batches(lengths, self.max_batch_size, self.max_batch_tokens):
            items = [flat[i] for i in group]
            batch = [r.inputs[j] for r, j in items]
            t0 = time.monotonic()
            try:
                out = await loop.run_in_executor(self._pool, self._embed, batch)
            except Exception as e:  # a failed forward fails its requests, not the loop
                log.exception("embedding forward of %d inputs failed", len(batch))
                for r, _ in items:
                    if not r.future.done():
                        r.future.set_exception(e)
                self.queued_inputs -= len(batch)
                continue
            self.batches += 1
            self.queued_inputs -= len(batch)
            if self._on_batch is not None:
                self._on_batch(len(batch), len(batch) * max(len(b) for b in batch), time.monotonic() - t0)
            for (r, j), row in zip(items, out, strict=True):
                r.rows[j] = row
                r.left -= 1
                if r.left == 0 and not r.future.done():
                    r.future.set_result(torch.stack(r.rows))  # type: ignore[arg-type]  # left == 0: every row is set
