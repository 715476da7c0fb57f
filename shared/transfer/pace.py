"""How often a receiving process progresses its transfer backend from the event loop.

A receiver must call into NIXL/UCX now and then, or a peer's first write never connects (the wire-up needs both
sides). While a write into this process is expected (a hand-off, a kvstore load or store in flight) it progresses
every FAST_S; otherwise every IDLE_S. Every expected write is bracketed by begin()/end(), and begin() wakes an idle
nap at once, so the slow idle pace never delays a transfer; it only bounds how late a stray peer gets progressed.

Why the idle pace matters: a timed wake-up of an asyncio loop costs ~200 us of CPU on the 2-core VMs this is
measured on (a bare time.sleep ~50 us), so the old 20 ms idle pace cost ~13 ms of CPU a second per process, in every
worker and kvstore, on the cores the engine's OpenMP team needs.
"""

from __future__ import annotations

import asyncio

FAST_S = 0.002
IDLE_S = 0.2


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class ProgressPace:
    """Counts the writes this process expects; `nap()` sleeps the pace that count calls for. Loop thread only."""

    def __init__(self, fast_s: float = FAST_S, idle_s: float = IDLE_S) -> None:
        self.fast_s, self.idle_s = fast_s, idle_s
        self.active = 0
        self._nap: asyncio.Future[None] | None = None

    def begin(self) -> None:
        self.active += 1
        self.wake()

    def wake(self) -> None:
        """End an idle nap now: a write may need progress at once."""
        if self._nap is not None:
            _settle(self._nap)

    def end(self) -> None:
        self.active = max(0, self.active - 1)

    async def nap(self, busy: bool = False) -> None:
        """Sleep FAST_S while begin() outnumbers end() or the caller says it is `busy`, else IDLE_S (or until wake)."""
        if self.active or busy:
            await asyncio.sleep(self.fast_s)
            return
        loop = asyncio.get_running_loop()
        nap = self._nap = loop.create_future()
        timer = loop.call_later(self.idle_s, _settle, nap)
        try:
            await nap
        finally:
            timer.cancel()
            self._nap = None
