"""Order of requests: who is admitted first and who is preempted first (the opposite end of the same order)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Literal

from shared.config.choices import SchedulePolicy
from shared.engine.request import Request

Policy = Literal["fcfs", "priority"]
POLICIES: tuple[str, ...] = ("fcfs", "priority")

SortKey = Callable[[Request], tuple[int, ...]]


def sort_key(policy: SchedulePolicy) -> SortKey:
    """Smaller key = served first = preempted last. fcfs: arrival order; priority: lower `priority` value first,
    then arrival. A preempted request keeps its arrival, so it goes back to the front of its class."""
    if policy is SchedulePolicy.FCFS:
        return lambda r: (r.arrival,)
    if policy is SchedulePolicy.PRIORITY:
        return lambda r: (r.priority, r.arrival)
    raise ValueError(f"schedule_policy must be one of {POLICIES} (got {policy!r})")


class WaitingQueue:
    """Requests waiting for admission, best first; removal by id is O(1) (stale heap entries are skipped)."""

    def __init__(self, policy: SchedulePolicy) -> None:
        self.key = sort_key(policy)
        self._heap: list[tuple[tuple[int, ...], int, Request]] = []
        self._live: dict[str, Request] = {}

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._live

    def push(self, req: Request) -> None:
        assert req.req_id not in self._live, f"request {req.req_id} is already waiting"
        self._live[req.req_id] = req
        heapq.heappush(self._heap, (self.key(req), req.arrival, req))

    def peek(self) -> Request | None:
        while self._heap:
            req = self._heap[0][2]
            if self._live.get(req.req_id) is req:
                return req
            heapq.heappop(self._heap)
        return None

    def pop(self) -> Request:
        req = self.peek()
        assert req is not None, "pop from an empty waiting queue"
        heapq.heappop(self._heap)
        del self._live[req.req_id]
        return req

    def remove(self, req_id: str) -> Request | None:
        return self._live.pop(req_id, None)

    def __iter__(self) -> Iterator[Request]:
        """Live requests, best first."""
        return iter(sorted(self._live.values(), key=self.key))
