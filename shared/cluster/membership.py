"""A watch-fed cache of the instances of a cluster, for routers and tools; it survives etcd blips.

    start():  one range read of the instances prefix at revision R, then a watch from R + 1.
    outage:   a probe notices etcd is unreachable: `.stale` becomes True, the last known membership keeps being
              served (routing on a slightly old view beats refusing every request).
    recovery: when the probe answers again, the watch restarts from the last revision seen + 1, so no join/leave
              in between is lost. If that revision was compacted, or etcd came back as a different store (a
              smaller revision, or a recreated epoch counter: a replaced etcd whose revisions mean nothing to
              us), a full read replaces the cache and the differences are emitted as events.

Consumers read `instances(...)`, register callbacks with `on_event(cb)`, or iterate `async for ev in m.events()`.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import msgspec
from etcd3aio import Etcd3Client, EtcdError, prefix_range_end

from shared.cluster.etcd import etcd_reachable
from shared.cluster.etcd_watch import watch_range
from shared.cluster.instance import InstanceInfo, InstanceState, decode_instance, epoch_counter_key, instances_prefix

log = logging.getLogger(__name__)

_PUT, _DELETE = 0, 1  # mvccpb.Event.EventType


class EventKind(enum.StrEnum):
    JOIN = "join"
    LEAVE = "leave"
    UPDATE = "update"  # same key, new value (state change, or a new epoch after a lost lease)


@dataclass(frozen=True)
class MembershipEvent:
    kind: EventKind
    instance: InstanceInfo  # for LEAVE: the last known value
    previous: InstanceInfo | None = None  # for UPDATE
    revision: int = 0


EventCallback = Callable[[MembershipEvent], Awaitable[None] | None]


class Membership:
    """Instances of one cluster (optionally one role), kept current by an etcd watch."""

    def __init__(
        self,
        client: Etcd3Client,
        cluster: str,
        role: str | None = None,
        *,
        probe_interval_s: float = 0.5,
        probe_timeout_s: float = 1.0,
    ) -> None:
        self._client = client
        self.cluster = cluster
        self.role = role
        self._prefix = instances_prefix(cluster, role)
        self._probe_interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._by_key: dict[str, InstanceInfo] = {}
        self._revision = 0  # everything up to here is reflected in _by_key
        self._stale = True
        self._stale_since: float | None = None
        self._callbacks: list[EventCallback] = []
        self._queues: list[asyncio.Queue[MembershipEvent]] = []
        self._changed = asyncio.Condition()
        self._watch_task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._need_snapshot = False
        self._last_restart = 0.0
        self._counter_created = 0  # create_revision of the epoch counter at the last full read (0: absent)
        self._counter_read_at = 0  # the revision of that read
        self.resyncs = 0  # full reads after the first one
        self.watch_restarts = 0

    # ------------------------------------------------------------------ public

    @property
    def stale(self) -> bool:
        """True while etcd is unreachable (or the watch is re-establishing): the view may be out of date."""
        return self._stale

    @property
    def stale_for_s(self) -> float:
        return 0.0 if self._stale_since is None else time.monotonic() - self._stale_since

    @property
    def revision(self) -> int:
        return self._revision

    def instances(self, role: str | None = None, *, state: InstanceState | None = None) -> list[InstanceInfo]:
        """Known instances, sorted by (role, instance id)."""
        out = [
            i for i in self._by_key.values() if (role is None or i.role == role) and (state is None or i.state == state)
        ]
        return sorted(out, key=lambda i: (i.role, i.instance_id))

    def ready(self, role: str | None = None) -> list[InstanceInfo]:
        return self.instances(role, state=InstanceState.READY)

    def get(self, instance_id: str, role: str | None = None) -> InstanceInfo | None:
        for i in self._by_key.values():
            if i.instance_id == instance_id and (role is None or i.role == role):
                return i
        return None

    def on_event(self, cb: EventCallback) -> Callable[[], None]:
        """Call `cb` (sync or async) for every join/leave/update; returns a function that unsubscribes."""
        self._callbacks.append(cb)
        return lambda: self._callbacks.remove(cb) if cb in self._callbacks else None

    async def events(self) -> AsyncIterator[MembershipEvent]:
        """Every event from now on, in order."""
        q: asyncio.Queue[MembershipEvent] = asyncio.Queue()
        self._queues.append(q)
        try:
            while True:
                yield await q.get()
        finally:
            self._queues.remove(q)

    async def wait_for(self, predicate: Callable[[Membership], bool], timeout: float) -> None:
        """Until predicate(self) holds (re-checked on every change); TimeoutError after `timeout` s."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))

    async def start(self) -> None:
        """Initial read + watch. Raises if etcd does not answer the initial read (connect with connect_etcd first)."""
        await self._snapshot(initial=True)
        self._stale, self._stale_since = False, None
        self._watch_task = asyncio.create_task(self._watch_loop(), name=f"membership-watch-{self.cluster}")
        self._probe_task = asyncio.create_task(self._probe_loop(), name=f"membership-probe-{self.cluster}")

    async def close(self) -> None:
        for t in (self._probe_task, self._watch_task):
            if t is not None:
                t.cancel()
        for t in (self._probe_task, self._watch_task):
            if t is not None:
                try:
                    await t
                except asyncio.CancelledError:
                    pass
        self._probe_task = self._watch_task = None

    async def __aenter__(self) -> Membership:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ internals

    def _decode(self, key: str, value: bytes) -> InstanceInfo | None:
        try:
            info = decode_instance(value)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            log.warning("skipping %s: not an InstanceInfo (%s)", key, e)
            return None
        if info.key != key:
            log.warning("skipping %s: its value claims to be %s", key, info.key)
            return None
        return info

    async def _snapshot(self, initial: bool = False) -> None:
        """Replace the cache with a full read and emit the differences."""
        assert self._client.kv is not None, "etcd client is not connected"
        resp = await self._client.kv.get(self._prefix, range_end=prefix_range_end(self._prefix), timeout=2.0)
        fresh: dict[str, InstanceInfo] = {}
        for kv in resp.kvs:
            key = kv.key.decode()
            info = self._decode(key, kv.value)
            if info is not None:
                fresh[key] = info
        rev = resp.header.revision
        self._counter_created, self._counter_read_at = await self._counter_create_revision()
        events: list[MembershipEvent] = []
        for key, old in self._by_key.items():
            if key not in fresh:
                events.append(MembershipEvent(EventKind.LEAVE, old, None, rev))
        for key, new in fresh.items():
            prev = self._by_key.get(key)
            if prev is None:
                events.append(MembershipEvent(EventKind.JOIN, new, None, rev))
            elif prev != new:
                events.append(MembershipEvent(EventKind.UPDATE, new, prev, rev))
        self._by_key, self._revision = fresh, rev
        if not initial:
            self.resyncs += 1
            log.info(
                "membership of %s resynced by a full read at revision %d (%d changes)", self._prefix, rev, len(events)
            )
        await self._emit(events)

    async def _counter_create_revision(self) -> tuple[int, int]:
        """(create_revision of the cluster's epoch counter, 0 if absent; the revision of this read)."""
        assert self._client.kv is not None, "etcd client is not connected"
        resp = await self._client.kv.get(epoch_counter_key(self.cluster), timeout=2.0)
        return (int(resp.kvs[0].create_revision) if resp.kvs else 0), int(resp.header.revision)

    async def _store_replaced(self, header_revision: int) -> bool:
        """On every (re)created watch: is this still the etcd store we were watching? (One small read.)"""
        if header_revision < self._revision:
            return True
        # Same revision range but a recreated counter: a new store that already took as many writes.
        created, read_at = await self._counter_create_revision()
        if created == self._counter_created:
            return False
        if self._counter_created == 0 and created > self._counter_read_at:
            # No counter when we last read it, and one created since: the cluster's first instance registered
            # after we started, in this very store. Calling that a new store made the watch resync from a full read
            # taken after a short-lived instance had come and gone, so its join and leave were never emitted.
            self._counter_created, self._counter_read_at = created, read_at
            return False
        return True

    def _apply(self, ev: Any, rev: int) -> MembershipEvent | None:  # ev: an etcd watch Event (untyped protobuf)
        kv = ev.kv
        key = kv.key.decode()
        old = self._by_key.get(key)
        if ev.type == _DELETE:
            if old is None:
                return None
            del self._by_key[key]
            return MembershipEvent(EventKind.LEAVE, old, None, rev)
        new = self._decode(key, kv.value)
        if new is None:
            # A broken value replaced a good one: treat the instance as gone rather than serve the old value.
            if old is not None:
                del self._by_key[key]
                return MembershipEvent(EventKind.LEAVE, old, None, rev)
            return None
        self._by_key[key] = new
        if old is None:
            return MembershipEvent(EventKind.JOIN, new, None, rev)
        return MembershipEvent(EventKind.UPDATE, new, old, rev) if new != old else None

    async def _watch_loop(self) -> None:
        assert self._client.watch is not None, "etcd client is not connected"
        while True:
            if self._need_snapshot:
                try:
                    await self._snapshot()
                    self._need_snapshot = False
                except (EtcdError, TimeoutError, OSError, grpc.aio.AioRpcError) as e:
                    log.warning("resync of %s failed (%s); retrying", self._prefix, e)
                    await asyncio.sleep(0.5)
                    continue
            created_seen = False
            restart = False
            stream = watch_range(
                self._client, self._prefix, prefix_range_end(self._prefix), start_revision=self._revision + 1
            )
            try:
                async for resp in stream:
                    if resp.canceled or resp.compact_revision > 0:
                        # start was compacted away: the history we missed is gone, read everything instead
                        log.warning(
                            "watch on %s canceled (compacted at %d); resyncing", self._prefix, resp.compact_revision
                        )
                        self._need_snapshot = restart = True
                        break
                    if resp.created:
                        if created_seen:
                            # the client re-created the watch on its own after a disconnect, from its own notion
                            # of the last revision; restart from ours so nothing is skipped
                            restart = True
                            break
                        created_seen = True
                        if await self._store_replaced(int(resp.header.revision)):
                            log.warning(
                                "etcd came back as a different store (revision %d, ours %d); resyncing",
                                resp.header.revision,
                                self._revision,
                            )
                            self._need_snapshot = restart = True
                            break
                        await self._set_fresh()
                        continue
                    events = []
                    top = self._revision
                    for ev in resp.events:
                        rev = int(ev.kv.mod_revision)
                        top = max(top, rev)
                        out = self._apply(ev, rev)
                        if out is not None:
                            events.append(out)
                    if not resp.events:  # progress notification: nothing missed up to header.revision
                        top = max(top, int(resp.header.revision))
                    self._revision = top
                    await self._emit(events)
            except (EtcdError, TimeoutError, OSError, grpc.aio.AioRpcError) as e:
                log.warning("watch on %s failed (%s); retrying", self._prefix, e)
                restart = True
            finally:
                await stream.aclose()
            if restart:
                self.watch_restarts += 1
                await asyncio.sleep(0.05)
                continue
            await asyncio.sleep(0.1)  # the stream ended without error: reopen it

    async def _set_fresh(self) -> None:
        if self._stale:
            log.info(
                "membership of %s is current again after %.1f s (revision %d, %d instances)",
                self._prefix,
                self.stale_for_s,
                self._revision,
                len(self._by_key),
            )
            self._stale, self._stale_since = False, None
            await self._notify_changed()

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._probe_interval_s)
            ok = await etcd_reachable(self._client, self._probe_timeout_s)
            if not ok and not self._stale:
                self._stale, self._stale_since = True, time.monotonic()
                log.warning(
                    "etcd unreachable: serving the last known membership of %s (%d instances, revision %d)",
                    self._prefix,
                    len(self._by_key),
                    self._revision,
                )
                await self._notify_changed()
            elif ok and self._stale and time.monotonic() - self._last_restart > 1.0:
                # Reopen the watch from our own last revision instead of waiting out the client's backoff;
                # its `created` answer marks the view fresh again.
                self._restart_watch()

    def _restart_watch(self) -> None:
        self._last_restart = time.monotonic()
        if self._watch_task is not None:
            self._watch_task.cancel()
        self.watch_restarts += 1
        self._watch_task = asyncio.create_task(self._watch_loop(), name=f"membership-watch-{self.cluster}")

    async def _notify_changed(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _emit(self, events: list[MembershipEvent]) -> None:
        for ev in events:
            log.debug(
                "membership %s %s/%s epoch %d state %s",
                ev.kind,
                ev.instance.role,
                ev.instance.instance_id,
                ev.instance.epoch,
                ev.instance.state,
            )
            for q in self._queues:
                q.put_nowait(ev)
            for cb in list(self._callbacks):
                try:
                    res = cb(ev)
                    if inspect.isawaitable(res):
                        await res
                except Exception:  # one consumer's bug must not stop the watch
                    log.exception("membership callback failed on %s", ev)
        await self._notify_changed()
