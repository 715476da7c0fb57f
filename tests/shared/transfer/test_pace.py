"""The receiver's progress pace: fast while a write is expected, slow otherwise, and an expected write never waits
for an idle nap to run out."""

from __future__ import annotations

import asyncio
import time

from shared.transfer.pace import ProgressPace


async def _timed_nap(pace: ProgressPace, busy: bool = False) -> float:
    t0 = time.monotonic()
    await pace.nap(busy=busy)
    return time.monotonic() - t0


async def test_idle_naps_the_idle_pace_and_busy_the_fast_one() -> None:
    pace = ProgressPace(fast_s=0.001, idle_s=0.3)
    assert await _timed_nap(pace) >= 0.29
    assert await _timed_nap(pace, busy=True) < 0.1
    pace.begin()
    assert await _timed_nap(pace) < 0.1
    pace.end()
    pace.end()  # one end too many does not make the count negative
    assert pace.active == 0
    assert await _timed_nap(pace) >= 0.29


async def test_begin_and_wake_end_an_idle_nap_at_once() -> None:
    pace = ProgressPace(fast_s=0.001, idle_s=5.0)
    for start in (pace.begin, pace.wake):
        nap = asyncio.ensure_future(_timed_nap(pace))
        await asyncio.sleep(0.05)
        start()
        assert await asyncio.wait_for(nap, 1.0) < 0.5
    pace.end()
    assert pace.active == 0
