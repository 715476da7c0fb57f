"""KV events: which pages an instance's prefix cache stored or evicted, by chained block hash.

The gateway's KV index (prefix-overlap credit for routing) is fed by these. The engine's radix-cache callback
calls `stored()` / `evicted()` / `cleared()` (from any thread); the publisher batches what arrives within a few
milliseconds into one KVEventBatch, keeping the order of operations, and numbers events per (instance, epoch) so a
consumer notices a gap (a lost message during an outage) and can drop that instance's entries until the next
`cleared` or a resync.

The publisher also keeps the net effect of everything it was told (`held`: the hashes a consumer that saw every
event holds), so a consumer that starts late or lost events asks for a snapshot (kv_snapshot.py) instead of waiting
for the cache to turn over: `snapshot()` returns that set with the sequence number it is consistent with.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import Iterable

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Handler


class KVOpKind(enum.StrEnum):
    STORED = "stored"
    EVICTED = "evicted"
    CLEARED = "cleared"  # everything this instance had is gone (restart, flush)


class KVOp(msgspec.Struct, frozen=True, array_like=True):
    kind: KVOpKind
    block_hashes: tuple[int, ...] = ()  # chained page hashes (shared.modelspec.block_hash), uint64


class KVEventBatch(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    epoch: int  # registration epoch of the publisher; a new epoch starts a new sequence
    seq: int  # 1, 2, 3, ... per (instance_id, epoch)
    ops: tuple[KVOp, ...]
    page_size: int
    tier: str = "device"  # "device" | "host" | "disk": where the pages live
    ts: float = 0.0  # unix seconds when the batch was sent
    # The pages' KVLayout kind (shared/modelspec/kv_layout.py) when it is not "mha": "mla" pages hold latent rows,
    # which only an engine of the same layout can use. Unset (not encoded at all) for mha: every mha event keeps
    # the bytes it had before the field existed, and an older publisher's events read as mha.
    layout_kind: str | msgspec.UnsetType = msgspec.UNSET

    @property
    def kind(self) -> str:
        """The pages' layout kind: "mha" unless the publisher said otherwise."""
        return "mha" if self.layout_kind is msgspec.UNSET else str(self.layout_kind)


class KVEventPublisher:
    """Batches cache callbacks into KVEvents on `pdrelay.<cluster>.kv.<instance>`. Thread-safe producers."""

    def __init__(
        self,
        bus: Bus,
        cluster: str,
        instance_id: str,
        *,
        epoch: int,
        page_size: int,
        tier: str = "device",
        layout_kind: str = "mha",
        batch_window_s: float = 0.005,
        max_batch_hashes: int = 4096,
    ) -> None:
        self._bus = bus
        self._subject = subjects.kv_events(cluster, instance_id)
        self._instance_id = instance_id
        self._epoch = epoch
        self._page_size = page_size
        self._tier = tier
        self._layout_kind: str | msgspec.UnsetType = msgspec.UNSET if layout_kind == "mha" else layout_kind
        self._window = batch_window_s
        self._max_batch = max_batch_hashes
        self._lock = threading.Lock()
        self._ops: list[KVOp] = []
        self._n_hashes = 0
        self._seq = 0
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        # What a consumer holds after every op added so far (published or still batched). A copy of the cache's
        # hashes (~100 bytes a page): bounded by the cache it mirrors.
        self._held: set[int] = set()

    def snapshot(self) -> tuple[int, int, tuple[int, ...]]:
        """(epoch, seq, hashes): the hashes a consumer holds once it applied every event up to `seq`, and the
        still-batched ops after it. Those ops will be published with a later seq, and replaying them on top of
        the snapshot changes nothing (stored / evicted / cleared are set operations: the last op on a hash
        decides), so a consumer takes the snapshot as "state at seq" and applies the events after it."""
        with self._lock:
            return self._epoch, self._seq, tuple(self._held)

    @property
    def seq(self) -> int:
        """The last sequence number given to an event (it may still be on its way out)."""
        return self._seq

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def tier(self) -> str:
        return self._tier

    def set_epoch(self, epoch: int) -> None:
        """After a re-registration: restart the sequence and tell consumers to forget the old incarnation."""
        with self._lock:
            self._epoch, self._seq = epoch, 0
            self._ops = [KVOp(KVOpKind.CLEARED)]
            self._n_hashes = 0
            self._held.clear()
        self._schedule()

    def stored(self, block_hashes: Iterable[int]) -> None:
        self._add(KVOpKind.STORED, tuple(block_hashes))

    def evicted(self, block_hashes: Iterable[int]) -> None:
        self._add(KVOpKind.EVICTED, tuple(block_hashes))

    def cleared(self) -> None:
        with self._lock:
            self._ops = [KVOp(KVOpKind.CLEARED)]  # what came before no longer matters
            self._n_hashes = 0
            self._held.clear()
        self._schedule()

    def _add(self, kind: KVOpKind, hashes: tuple[int, ...]) -> None:
        if not hashes:
            return
        with self._lock:
            if self._ops and self._ops[-1].kind == kind:  # merge runs of the same kind, keeping order
                self._ops[-1] = KVOp(kind, self._ops[-1].block_hashes + hashes)
            else:
                self._ops.append(KVOp(kind, hashes))
            self._n_hashes += len(hashes)
            if kind == KVOpKind.STORED:
                self._held.update(hashes)
            else:
                self._held.difference_update(hashes)
            full = self._n_hashes >= self._max_batch
        self._schedule(now=full)

    def _schedule(self, now: bool = False) -> None:
        def arm() -> None:
            if self._flush_scheduled and not now:
                return
            self._flush_scheduled = True
            task = asyncio.ensure_future(self._flush_after(0.0 if now else self._window))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            arm()
        else:
            self._loop.call_soon_threadsafe(arm)

    async def _flush_after(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        await self.flush()

    async def flush(self) -> None:
        with self._lock:
            ops, self._ops, self._n_hashes = self._ops, [], 0
            self._flush_scheduled = False
            if not ops:
                return
            self._seq += 1
            event = KVEventBatch(
                instance_id=self._instance_id,
                epoch=self._epoch,
                seq=self._seq,
                ops=tuple(ops),
                page_size=self._page_size,
                tier=self._tier,
                ts=time.time(),
                layout_kind=self._layout_kind,
            )
        await self._bus.publish(self._subject, event)

    async def close(self) -> None:
        await self.flush()
        for t in list(self._tasks):
            t.cancel()


async def subscribe_kv_events(
    bus: Bus, cluster: str, handler: Handler[KVEventBatch], instance_id: str = subjects.ANY
) -> Subscription:
    return await bus.subscribe(subjects.kv_events(cluster, instance_id), KVEventBatch, handler)
