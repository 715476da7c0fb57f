"""Keeps the KV index exact: snapshots of the instances' caches when the gateway starts, when an instance becomes
ready, and whenever an entry turns degraded (a sequence gap, events lost in a NATS outage).

The hand-over from snapshot to live events (what Dynamo's router, SGLang's and vLLM's routers leave open): the
gateway is subscribed to the KV events before it asks; the index holds the instance's events back while the
snapshot is on its way (KVIndex.begin_rebuild), takes the snapshot as the instance's state at its sequence number
S, and then applies the held events after S. The publisher numbers every event of an epoch and its snapshot is
consistent with one of those numbers (kv_events.KVEventPublisher.snapshot), so a lost event shows as a gap and
sends the instance round again instead of being skipped silently.

A failed snapshot (no answer within the timeout: an old build, an instance hung or partitioned away) leaves the
entry degraded, routed by load, and is tried again after a backoff that doubles up to `max_retry_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from services.gateway.routing.kv_index import IndexState, KVIndex
from shared.cluster.bus.kv_index_status import KVIndexEntry, KVIndexStatus
from shared.cluster.bus.kv_snapshot import KVSnapshot

log = logging.getLogger(__name__)

Fetch = Callable[[str], Awaitable[KVSnapshot]]
# (instance id, epoch, last KV event seq it published), from the instances' load reports
Published = Callable[[], Iterable[tuple[str, int, int]]]


@dataclass
class SyncStats:
    requested: int = 0  # snapshots asked for
    rebuilt: int = 0  # of which made the entry exact
    failed: int = 0  # no snapshot (timeout, error)
    last_rebuild_s: float = 0.0  # how long the last snapshot took, request to applied


class KVIndexSync:
    """Asks instances for snapshots, `concurrency` at a time. Runs on the event loop that feeds the index."""

    def __init__(
        self,
        index: KVIndex,
        fetch: Fetch,
        *,
        published: Published | None = None,
        concurrency: int = 8,
        interval_s: float = 0.25,
        retry_s: float = 0.5,
        max_retry_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self._fetch = fetch
        self._published = published
        self._concurrency = concurrency
        self._interval_s = interval_s
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._clock = clock
        self._wanted: set[str] = set()
        self._backoff: dict[str, float] = {}  # instance -> current retry delay
        self._next_try: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.stats = SyncStats()

    # ------------------------------------------------------------------ requests

    def want(self, instance_id: str) -> None:
        """Make the instance's entry exact, now (a ready instance the index has not seen from the start)."""
        self._wanted.add(instance_id)
        self._next_try.pop(instance_id, None)
        self._idle.clear()
        self._wake.set()

    def forget(self, instance_id: str) -> None:
        """The instance left: no snapshot of it is wanted any more."""
        self._wanted.discard(instance_id)
        self._backoff.pop(instance_id, None)
        self._next_try.pop(instance_id, None)
        task = self._inflight.pop(instance_id, None)
        if task is not None:
            task.cancel()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="kv-index-sync")

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._inflight.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._inflight.clear()

    async def settle(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until every wanted snapshot was tried once; True if nothing is left to do."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    # ------------------------------------------------------------------ the loop

    def _due(self, now: float) -> list[str]:
        due = self._wanted | set(self.index.needing_snapshot())
        return sorted(i for i in due if i not in self._inflight and self._next_try.get(i, 0.0) <= now)

    async def _loop(self) -> None:
        while True:
            if self._published is not None:
                for iid, epoch, seq in self._published():
                    self.index.note_published(iid, epoch, seq)
            now = self._clock()
            for iid in self._due(now):
                if len(self._inflight) >= self._concurrency:
                    break
                self._wanted.discard(iid)
                if not self.index.begin_rebuild(iid):
                    continue  # exact already (it was seen from seq 1), or being rebuilt
                self._inflight[iid] = asyncio.create_task(self._one(iid), name=f"kv-snapshot-{iid}")
            if not self._inflight and not self._wanted:
                self._idle.set()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            except TimeoutError:
                pass

    async def _one(self, iid: str) -> None:
        t0 = self._clock()
        self.stats.requested += 1
        try:
            try:
                snap = await self._fetch(iid)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  any failure is "no snapshot": routed by load, tried again
                self._failed(iid, f"{type(e).__name__}: {e}")
                return
            state = self.index.load_snapshot(snap)
            self.stats.last_rebuild_s = self._clock() - t0
            if state == IndexState.EXACT:
                self.stats.rebuilt += 1
                self._backoff.pop(iid, None)
                log.info(
                    "KV index: %s rebuilt from its snapshot (%d pages at seq %d, epoch %d) in %.0f ms",
                    iid,
                    len(snap.hashes),
                    snap.seq,
                    snap.epoch,
                    self.stats.last_rebuild_s * 1e3,
                )
            else:
                self._retry_later(iid)
        finally:
            self._inflight.pop(iid, None)
            self._wake.set()

    def _failed(self, iid: str, why: str) -> None:
        self.stats.failed += 1
        self.index.rebuild_failed(iid)
        delay = self._retry_later(iid)
        log.warning("KV index: no snapshot from %s (%s); routing it by load, next try in %.1f s", iid, why, delay)

    def _retry_later(self, iid: str) -> float:
        delay = min(self._max_retry_s, self._backoff.get(iid, self._retry_s / 2) * 2)
        self._backoff[iid] = delay
        self._next_try[iid] = self._clock() + delay
        return delay


def index_status(index: KVIndex, gateway_id: str) -> KVIndexStatus:
    """The index per instance, for `pdrelay status` (shared.cluster.bus.kv_index_status)."""
    return KVIndexStatus(
        gateway_id=gateway_id,
        entries=tuple(
            KVIndexEntry(e.instance_id, e.state.value, e.reason, e.epoch, e.seq, e.pages) for e in index.entries()
        ),
        total_entries=index.holders.refs,
        max_entries=index.max_entries,
        approx_bytes=index.approx_bytes(),
        snapshots=index.stats.snapshots,
        gaps=index.stats.gaps,
    )
