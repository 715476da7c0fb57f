"""The disaggregated decode's waiting queue: the same admission model as the colocated worker's engine.

A hand-off needs a running slot and KV pages on decode before a prefill is ticketed (`reserve_remote`). When the
engine has neither, the request waits here, first come first served, up to `--max-queued-requests`; only a request
that finds the queue full is refused (OVERLOADED: the gateway tries another decode, and answers 429 with
Retry-After when every one refused). Only the head of the queue retries the reservation, when a request of this
decode ends or every `poll_s`, so a long queue costs one engine call per wake-up, not one per waiter.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.engine.errors import QueueFull

T = TypeVar("T")


class AdmissionQueue:
    def __init__(self, max_queued: int, *, poll_s: float = 0.05) -> None:
        if max_queued < 0:
            raise ValueError(f"max_queued must be >= 0 (got {max_queued})")
        self.max_queued = max_queued
        self._poll_s = poll_s
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._freed = asyncio.Event()
        self.refused = 0  # requests that found the queue full (for metrics and tests)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def freed(self) -> None:
        """A request of this decode ended (its slot and pages may be free): let the head of the queue try."""
        self._freed.set()

    async def admit(self, reserve: Callable[[], Awaitable[T]]) -> T:
        """`reserve()` now if nobody waits and it succeeds; else wait in line. Raises QueueFull when the queue is
        full (the reservation's own error, naming the limit). Cancelling the caller leaves the queue."""
        if not self._waiters:
            try:
                return await reserve()
            except QueueFull as e:
                first_refusal = e
        else:
            first_refusal = None
        if len(self._waiters) >= self.max_queued:
            self.refused += 1
            why = f"{first_refusal}; " if first_refusal is not None else ""
            raise QueueFull(f"{why}{len(self._waiters)} requests already wait for a slot "
                            f"(--max-queued-requests {self.max_queued}); retry later or on another instance")
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._waiters:
            turn.set_result(None)  # first in line: my turn already
        self._waiters.append(turn)
        try:
            await turn
            while True:
                self._freed.clear()
                try:
                    return await reserve()
                except QueueFull:
                    pass
                try:
                    await asyncio.wait_for(self._freed.wait(), self._poll_s)
                except TimeoutError:
                    pass
        finally:
            self._leave(turn)

    def _leave(self, turn: asyncio.Future[None]) -> None:
        head = bool(self._waiters) and self._waiters[0] is turn
        try:
            self._waiters.remove(turn)
        except ValueError:
            pass
        if not turn.done():
            turn.cancel()
        if head and self._waiters and not self._waiters[0].done():
            self._waiters[0].set_result(None)  # the next one's turn
