"""The decode's prefill choice (breakers per prefill, prompt-derived hand-off deadlines) and its admission queue."""

from __future__ import annotations

import asyncio

import pytest

from proto.pdrelay.v1 import common_pb2
from services.decode.admission import AdmissionQueue
from services.decode.prefill_choice import FIXED_S, SLACK, PrefillChoice, is_refusal, is_sick
from shared.cluster.breaker import BreakerState
from shared.engine.errors import QueueFull

E = common_pb2


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_deadline_is_the_cap_until_measured_then_follows_the_prompt() -> None:
    c = PrefillChoice(max_timeout_s=30.0, min_timeout_s=3.0)
    assert c.deadline_s(100) == 30.0  # nothing measured yet: cold caches and connections get the whole budget
    a = c.attempt("p1", 1000)
    c.done(a, 1.0, ok=True, sick=False)  # 1000 tokens/s
    assert c.tokens_per_s == pytest.approx(1000)
    assert c.deadline_s(100) == 3.0  # short prompt: the floor
    assert c.deadline_s(5000) == pytest.approx(FIXED_S + SLACK * 5.0)
    assert c.deadline_s(10**6) == 30.0  # never over --handoff-timeout-s
    # prompts in flight on this decode count as queue ahead of the next one
    c.attempt("p1", 4000)
    assert c.deadline_s(1000) == pytest.approx(FIXED_S + SLACK * 5.0)


def test_consecutive_failures_open_the_breaker_and_a_probe_closes_it() -> None:
    clock = Clock()
    c = PrefillChoice(max_timeout_s=30.0, min_timeout_s=3.0, clock=clock)
    targets = [("p-hung", "a:1"), ("p-ok", "a:2")]
    for _ in range(2):
        c.done(c.attempt("p-hung", 10), 3.0, ok=False, sick=True)
    assert c.breakers.get("p-hung").state == BreakerState.OPEN
    assert c.order(targets) == [("p-ok", "a:2")]  # the gateway's choice is skipped while open
    clock.t += 60
    assert c.order(targets) == targets  # half-open: one probe may go
    c.done(c.attempt("p-hung", 10), 0.1, ok=True, sick=False)
    assert c.breakers.get("p-hung").state == BreakerState.CLOSED


def test_refusals_do_not_open_the_breaker_and_when_all_are_open_all_are_tried() -> None:
    c = PrefillChoice(max_timeout_s=30.0, min_timeout_s=3.0)
    for _ in range(5):
        c.done(c.attempt("busy", 10), 0.01, ok=False, sick=is_sick(E.ERROR_CODE_OVERLOADED, True))
    assert c.breakers.get("busy").state == BreakerState.CLOSED
    for p in ("a", "b"):
        for _ in range(2):
            c.done(c.attempt(p, 10), 1.0, ok=False, sick=True)
    assert c.order([("a", "x"), ("b", "y")]) == [("a", "x"), ("b", "y")]


def test_which_failures_wrote_nothing() -> None:
    assert is_refusal(E.ERROR_CODE_OVERLOADED, typed=True)
    assert is_refusal(E.ERROR_CODE_STALE_EPOCH, typed=True)
    assert not is_refusal(E.ERROR_CODE_TRANSFER_FAILED, typed=True)  # it may have written part
    assert not is_refusal(E.ERROR_CODE_UNAVAILABLE, typed=False)  # reset or deadline: it may still be writing
    assert is_sick(E.ERROR_CODE_UNAVAILABLE, typed=False) and is_sick(E.ERROR_CODE_CHECKSUM_MISMATCH, typed=True)


class Slots:
    """A reservation that succeeds while fewer than `n` are held."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.held = 0

    async def reserve(self) -> int:
        if self.held >= self.n:
            raise QueueFull(f"{self.held} running reach max_running_requests={self.n}")
        self.held += 1
        return self.held


async def test_admission_queues_in_order_and_refuses_only_when_full() -> None:
    slots = Slots(2)
    q = AdmissionQueue(max_queued=3, poll_s=0.01)
    assert await q.admit(slots.reserve) == 1
    assert await q.admit(slots.reserve) == 2
    order: list[int] = []

    async def waiter(i: int) -> None:
        await q.admit(slots.reserve)
        order.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0.05)
    assert q.waiting == 3
    with pytest.raises(QueueFull, match="max-queued-requests 3"):
        await q.admit(slots.reserve)
    assert q.refused == 1
    for _ in range(3):
        slots.held -= 1
        q.freed()
        await asyncio.sleep(0.03)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2] and q.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_passes_its_turn() -> None:
    slots = Slots(0)
    q = AdmissionQueue(max_queued=4, poll_s=0.01)
    first = asyncio.create_task(q.admit(slots.reserve))
    second = asyncio.create_task(q.admit(slots.reserve))
    await asyncio.sleep(0.03)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    slots.n = 1
    assert await asyncio.wait_for(second, 1.0) == 1
    assert q.waiting == 0
