"""The disaggregated decode's waiting queue: the same admission model as the colocated worker's engine.

A hand-off needs a running slot and KV pages on decode before a prefill is ticketed (`reserve_remote`). When the
engine has neither, the request waits here, first come first served, up to `--max-queued-requests`; only a request
that finds the queue full is refused (OVERLOADED: the gateway tries another decode, and answers 429 with
Retry-After when every one refused). The wait is bounded in time too (`--max-queue-wait-s`): a request whose
estimated wait (its place in line x the measured time a request holds a slot / the requests running) is longer is
refused at once, and one that has waited that long anyway is refused then, so under overload a client gets a clear
429 early instead of an answer after its own timeout. Only the head of the queue retries the reservation, when a request of this
decode ends or every `poll_s`, so a long queue costs one engine call per wake-up, not one per waiter.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.engine.errors import QueueFull

T = TypeVar("T")


class AdmissionQueue:
    def __init__(
        self,
        max_queued: int,
        *,
        max_wait_s: float = 0.0,
        poll_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queued < 0:
            raise ValueError(f"max_queued must be >= 0 (got {max_queued})")
        self.max_queued = max_queued
        self.max_wait_s = max_wait_s  # 0: bounded by count only
        self._poll_s = poll_s
        self._clock = clock
        self.running = 0  # admitted and not yet freed
        self.hold_s: float | None = None  # measured time a request holds its slot (EWMA of finished ones)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._freed = asyncio.Event()
        self.refused = 0  # requests that found the queue full (for metrics and tests)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def freed(self, held_s: float | None = None) -> None:
        """An admitted request of this decode ended (its slot and pages may be free): let the head of the queue
        try. `held_s`: how long it held its slot, when it was served to the end (the wait estimate learns from it)."""
        self.running = max(0, self.running - 1)
        if held_s is not None:
            self.hold_s = held_s if self.hold_s is None else 0.8 * self.hold_s + 0.2 * held_s
        self._freed.set()

    def estimated_wait_s(self, place: int) -> float | None:
        """Seconds the `place`-th in line (0: the head) should wait for a slot; None until a request was measured."""
        if self.hold_s is None:
            return None
        return (place + 1) * self.hold_s / max(1, self.running)

    def _refuse(self, why: str) -> QueueFull:
        self.refused += 1
        return QueueFull(f"{why}; retry later or on another instance")

    async def admit(self, reserve: Callable[[], Awaitable[T]]) -> T:
        """`reserve()` now if nobody waits and it succeeds; else wait in line. Raises QueueFull when the queue is
        full (the reservation's own error, naming the limit). Cancelling the caller leaves the queue."""
        if not self._waiters:
            try:
                return self._admitted(await reserve())
            except QueueFull as e:
                first_refusal = e
        else:
            first_refusal = None
        why = f"{first_refusal}; " if first_refusal is not None else ""
        if len(self._waiters) >= self.max_queued:
            raise self._refuse(
                f"{why}{len(self._waiters)} requests already wait for a slot (--max-queued-requests {self.max_queued})"
            )
        wait = self.estimated_wait_s(len(self._waiters))
        if self.max_wait_s and wait is not None and wait > self.max_wait_s:
            raise self._refuse(
                f"{why}the wait for a slot behind {len(self._waiters)} requests is estimated at "
                f"{wait:.0f} s (--max-queue-wait-s {self.max_wait_s:g})"
            )
        give_up = self._clock() + self.max_wait_s if self.max_wait_s else None
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._waiters:
            turn.set_result(None)  # first in line: my turn already
        self._waiters.append(turn)
        try:
            try:
                # behind others: wait for my turn, but not past the bound
                await asyncio.wait_for(asyncio.shield(turn), None if give_up is None else give_up - self._clock())
            except TimeoutError:
                raise self._refuse(f"no slot freed within --max-queue-wait-s {self.max_wait_s:g}") from None
            while True:
                self._freed.clear()
                try:
                    return self._admitted(await reserve())
                except QueueFull:
                    pass
                if give_up is not None and self._clock() >= give_up:
                    raise self._refuse(f"no slot freed within --max-queue-wait-s {self.max_wait_s:g}")
                try:
                    await asyncio.wait_for(self._freed.wait(), self._poll_s)
                except TimeoutError:
                    pass
        finally:
            self._leave(turn)

    def _admitted(self, res: T) -> T:
        self.running += 1
        return res

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
