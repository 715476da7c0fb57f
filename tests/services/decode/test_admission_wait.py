"""The decode's admission queue is bounded in time as well as in count (--max-queue-wait-s)."""

from __future__ import annotations

import asyncio

import pytest

from services.decode.admission import AdmissionQueue
from shared.engine.errors import QueueFull


class Slots:
    def __init__(self, n: int) -> None:
        self.n = n
        self.held = 0

    async def reserve(self) -> int:
        if self.held >= self.n:
            raise QueueFull(f"{self.held} running reach max_running_requests={self.n}")
        self.held += 1
        return self.held


async def test_a_request_whose_estimated_wait_is_too_long_is_refused_at_once() -> None:
    slots = Slots(2)
    q = AdmissionQueue(max_queued=100, max_wait_s=10.0, poll_s=0.01)
    await q.admit(slots.reserve)
    await q.admit(slots.reserve)
    assert q.running == 2 and q.estimated_wait_s(0) is None  # nothing measured: the count bounds the queue
    slots.held -= 1
    q.freed(8.0)  # a request held its slot 8 s
    await q.admit(slots.reserve)
    assert q.estimated_wait_s(0) == pytest.approx(8.0 / 2)
    waiters = [asyncio.create_task(q.admit(slots.reserve)) for _ in range(2)]  # 4 s and 8 s ahead: queued
    await asyncio.sleep(0.03)
    assert q.waiting == 2
    with pytest.raises(QueueFull, match="estimated at 12 s .--max-queue-wait-s 10"):
        await q.admit(slots.reserve)
    assert q.refused == 1 and q.waiting == 2
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert q.waiting == 0


async def test_a_request_that_waited_the_bound_is_refused_and_the_next_one_gets_its_turn() -> None:
    slots = Slots(1)
    q = AdmissionQueue(max_queued=100, max_wait_s=0.2, poll_s=0.01)
    await q.admit(slots.reserve)
    head = asyncio.create_task(q.admit(slots.reserve))
    behind = asyncio.create_task(q.admit(slots.reserve))
    for t in (head, behind):  # the head retries, the one behind it waits for its turn: both give up in time
        with pytest.raises(QueueFull, match="within --max-queue-wait-s 0.2"):
            await asyncio.wait_for(t, 2.0)
    assert q.waiting == 0 and q.refused == 2
    slots.held = 0
    q.freed()
    assert await q.admit(slots.reserve) == 1  # an empty queue admits at once again
