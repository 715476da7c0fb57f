"""KV snapshots: an instance's cached block hashes at a sequence number, over NATS request/reply.

A gateway that starts (or restarts) after the instances did, or that lost KV events in an outage, knows nothing
or too little of what their prefix caches hold. It asks each instance on `pdrelay.<cluster>.kvsnap.<instance>`:

    request 1   KVSnapshotRequest()                          -> part 0, with the snapshot's id and its part count
    request k   KVSnapshotRequest(snapshot_id=id, part=k)    -> part k of the same snapshot (frozen when taken)

The snapshot is the publisher's `held` set (kv_events.py) with the (epoch, seq) it is consistent with: the
consumer subscribes to the events first, takes the snapshot as its state at `seq`, and applies the events after
`seq` it buffered meanwhile. Parts keep each reply under NATS's default 1 MiB payload (a hash is 9 bytes in
msgpack). An instance without a publisher yet (still warming up; a kvstore no engine has bound) answers an empty
snapshot at seq 0 of its epoch: it has published nothing in that epoch.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Meta
from shared.cluster.bus.kv_events import KVEventPublisher

log = logging.getLogger(__name__)

PART_HASHES = 65_536  # ~590 KB of msgpack per part
KEEP_S = 30.0  # how long a taken snapshot's parts stay fetchable
KEEP_MAX = 4  # snapshots kept at once (several gateways rebuilding together)


class KVSnapshotRequest(msgspec.Struct, frozen=True, kw_only=True):
    snapshot_id: int = 0  # 0: take a new snapshot and answer its part 0
    part: int = 0


class KVSnapshotPart(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    epoch: int
    seq: int  # the snapshot is the state after applying events 1..seq of `epoch`
    page_size: int
    tier: str
    snapshot_id: int
    part: int
    parts: int
    hashes: tuple[int, ...]
    error: str = ""  # the snapshot id expired: start again


@dataclass(frozen=True)
class KVSnapshot:
    instance_id: str
    epoch: int
    seq: int
    page_size: int
    tier: str
    hashes: tuple[int, ...]


@dataclass
class _Taken:
    at: float
    epoch: int
    seq: int
    page_size: int
    tier: str
    hashes: tuple[int, ...]

    @property
    def parts(self) -> int:
        return max(1, -(-len(self.hashes) // PART_HASHES))


class KVSnapshotServer:
    """Answers snapshot requests for one instance from its KV event publisher (which may not exist yet)."""

    def __init__(
        self,
        bus: Bus,
        cluster: str,
        instance_id: str,
        publisher: Callable[[], KVEventPublisher | None],
        epoch: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bus = bus
        self._subject = subjects.kv_snapshot(cluster, instance_id)
        self._instance_id = instance_id
        self._publisher = publisher
        self._epoch = epoch
        self._clock = clock
        self._ids = itertools.count(1)
        self._taken: dict[int, _Taken] = {}
        self._sub: Subscription | None = None
        self.served = 0  # snapshots taken (part 0 requests)

    async def start(self) -> None:
        self._sub = await self._bus.serve(self._subject, KVSnapshotRequest, self.answer)
        try:  # in place at the server before the instance turns ready (a gateway asks as soon as it sees that)
            await self._bus.flush()
        except Exception as e:  # noqa: BLE001  NATS away: the subscription comes back with the connection
            log.warning("KV snapshots: flush after subscribing failed: %s", e)

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # noqa: BLE001  NATS already closed: nothing left to unsubscribe from
                pass
            self._sub = None

    def answer(self, req: KVSnapshotRequest, meta: Meta | None = None) -> KVSnapshotPart:
        now = self._clock()
        for sid in [s for s, t in self._taken.items() if now - t.at > KEEP_S]:
            del self._taken[sid]
        if req.snapshot_id == 0:
            sid, taken = next(self._ids), self._take(now)
            while len(self._taken) >= KEEP_MAX:
                del self._taken[min(self._taken)]
            self._taken[sid] = taken
            self.served += 1
            return self._part(sid, taken, 0)
        found = self._taken.get(req.snapshot_id)
        if found is None or not 0 <= req.part < found.parts:
            return KVSnapshotPart(
                instance_id=self._instance_id,
                epoch=self._epoch(),
                seq=0,
                page_size=0,
                tier="",
                snapshot_id=req.snapshot_id,
                part=req.part,
                parts=0,
                hashes=(),
                error=f"snapshot {req.snapshot_id} part {req.part} is gone (kept {KEEP_S:g} s); take a new one",
            )
        return self._part(req.snapshot_id, found, req.part)

    def _take(self, now: float) -> _Taken:
        pub = self._publisher()
        if pub is None:
            return _Taken(now, self._epoch(), 0, 0, "device", ())
        epoch, seq, hashes = pub.snapshot()
        return _Taken(now, epoch, seq, pub.page_size, pub.tier, hashes)

    def _part(self, sid: int, t: _Taken, part: int) -> KVSnapshotPart:
        return KVSnapshotPart(
            instance_id=self._instance_id,
            epoch=t.epoch,
            seq=t.seq,
            page_size=t.page_size,
            tier=t.tier,
            snapshot_id=sid,
            part=part,
            parts=t.parts,
            hashes=t.hashes[part * PART_HASHES : (part + 1) * PART_HASHES],
        )


async def fetch_kv_snapshot(bus: Bus, cluster: str, instance_id: str, *, timeout_s: float = 2.0) -> KVSnapshot:
    """The instance's snapshot, all parts. Raises TimeoutError (no answer: not serving snapshots, unreachable) or
    ValueError (a part expired or came from another snapshot)."""
    subject = subjects.kv_snapshot(cluster, instance_id)
    first = await bus.request(subject, KVSnapshotRequest(), KVSnapshotPart, timeout_s=timeout_s)
    if first.error:
        raise ValueError(f"KV snapshot of {instance_id}: {first.error}")
    hashes = list(first.hashes)
    for part in range(1, first.parts):
        req = KVSnapshotRequest(snapshot_id=first.snapshot_id, part=part)
        got = await bus.request(subject, req, KVSnapshotPart, timeout_s=timeout_s)
        if got.error or (got.epoch, got.seq, got.snapshot_id) != (first.epoch, first.seq, first.snapshot_id):
            raise ValueError(f"KV snapshot of {instance_id}: part {part} {got.error or 'does not match part 0'}")
        hashes.extend(got.hashes)
    return KVSnapshot(instance_id, first.epoch, first.seq, first.page_size, first.tier, tuple(hashes))
