"""The routing layer's I/O: ready instances from the etcd membership, loads from the NATS load table, KV events into
the KV index, and cleanup when instances leave. Everything it produces is plain data for the pure router.

    pools(model)   Pools of READY decode / prefill / worker instances serving `model`, each with its latest load
    start()        subscribe to KV events and load reports, then ask the ready instances for snapshots of their
                   caches (kv_sync.py); watch membership for joins, leaves and epoch changes

Pools are built from the membership per call; past POOLS_CACHE_MIN ready instances they are kept for
POOLS_CACHE_S (and rebuilt on any membership change), so a large cluster does not rebuild a thousand candidates
for every request. Their loads are then up to POOLS_CACHE_S older, next to the ~200 ms between load reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from nats.aio.subscription import Subscription

from services.gateway.routing.kv_sync import KVIndexSync
from services.gateway.routing.router import Router
from services.gateway.routing.views import Candidate, Load, Pools
from shared.cluster.bus.client import Bus, Meta
from shared.cluster.bus.kv_events import KVEventBatch, subscribe_kv_events
from shared.cluster.bus.kv_snapshot import KVSnapshot, fetch_kv_snapshot
from shared.cluster.bus.load import LoadReport, LoadTable
from shared.cluster.instance import InstanceInfo, InstanceState
from shared.cluster.membership import EventKind, MembershipEvent
from shared.config.roles import Role

log = logging.getLogger(__name__)

DECODE_ROLE, PREFILL_ROLE, WORKER_ROLE = Role.DECODE, Role.PREFILL, Role.WORKER
ROUTED_ROLES = (DECODE_ROLE, PREFILL_ROLE, WORKER_ROLE)
KV_ROLES = (*ROUTED_ROLES, Role.KVSTORE)  # instances whose caches the KV index tracks
POOLS_CACHE_MIN = 64
POOLS_CACHE_S = 0.05


class MembershipView(Protocol):
    """What routing reads from shared.cluster.membership.Membership (tests pass a static fake)."""

    @property
    def stale(self) -> bool: ...

    def ready(self, role: str | None = None) -> list[InstanceInfo]: ...

    def instances(self, role: str | None = None) -> list[InstanceInfo]: ...

    def on_event(self, cb: Callable[[MembershipEvent], Awaitable[None] | None]) -> Callable[[], None]: ...


def candidate_of(info: InstanceInfo, loads: LoadTable, max_load_age_s: float) -> Candidate:
    page_size = info.capacity.page_size or (info.kv_layout.page_size if info.kv_layout is not None else 0)
    report = loads.latest.get(info.instance_id)
    age = loads.age_s(info.instance_id)
    load = Load()
    # A report of an older incarnation, or one too old, says nothing about the instance now.
    if report is not None and age is not None and age <= max_load_age_s and report.epoch >= info.epoch:
        s = report.load
        load = Load(
            running=s.running,
            queued=s.queued,
            queued_prefill_tokens=s.queued_prefill_tokens,
            free_pages=s.free_pages,
            total_pages=s.total_pages,
            known=True,
        )
    return Candidate(
        instance_id=info.instance_id,
        role=info.role,
        grpc_address=info.grpc_address,
        epoch=info.epoch,
        model=info.model,
        page_size=page_size,
        max_running=info.capacity.max_running_requests,
        load=load,
    )


def serves(info: InstanceInfo, model: str | None) -> bool:
    """An instance that registered no model name serves whatever it was started with: accept it."""
    return model is None or not info.model or info.model == model


class Discovery:
    """Membership + load table + KV events feeding one Router."""

    def __init__(
        self,
        membership: MembershipView,
        router: Router,
        *,
        bus: Bus | None = None,
        cluster: str = "",
        max_load_age_s: float = 2.0,
        on_leave: Callable[[InstanceInfo], object] | None = None,
        on_join: Callable[[InstanceInfo], object] | None = None,
        snapshot_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.membership = membership
        self.router = router
        self.loads = LoadTable()
        self._bus = bus
        self._cluster = cluster
        self._max_load_age_s = max_load_age_s
        self._on_leave = on_leave
        self._on_join = on_join
        self._subs: list[Subscription] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._snapshot_timeout_s = snapshot_timeout_s
        self.kv_sync: KVIndexSync | None = None
        self._clock = clock
        self._pools: dict[str | None, tuple[float, Pools]] = {}
        # instance -> (registration, load report, candidate, valid until): see _candidate
        self._cands: dict[str, tuple[InstanceInfo, LoadReport | None, Candidate, float]] = {}

    async def start(self) -> None:
        self._unsubscribe = self.membership.on_event(self._on_membership)
        if self._bus is not None:
            await self.loads.subscribe(self._bus, self._cluster)
            # Events first: the snapshots asked for below are applied with the events that arrive meanwhile.
            self._subs.append(await subscribe_kv_events(self._bus, self._cluster, self._on_kv_event))
            self.kv_sync = KVIndexSync(self.router.kv_index, self._fetch_snapshot, published=self._published)
            for info in self.membership.instances():
                if info.role in KV_ROLES and info.state == InstanceState.READY:
                    self.kv_sync.want(info.instance_id)
            await self.kv_sync.start()

    def _published(self) -> list[tuple[str, int, int]]:
        return [(r.instance_id, r.epoch, r.load.kv_seq) for r in self.loads.latest.values() if r.load.kv_seq]

    async def _fetch_snapshot(self, instance_id: str) -> KVSnapshot:
        assert self._bus is not None
        return await fetch_kv_snapshot(self._bus, self._cluster, instance_id, timeout_s=self._snapshot_timeout_s)

    async def settle(self, timeout_s: float) -> bool:
        """Wait until the KV index asked every ready instance for its snapshot (at most `timeout_s`)."""
        return True if self.kv_sync is None else await self.kv_sync.settle(timeout_s)

    async def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.kv_sync is not None:
            await self.kv_sync.close()
        await self.loads.close()
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception as e:  # NATS already closed: nothing left to unsubscribe from  # noqa: BLE001
                log.debug("unsubscribe failed: %s", e)
        self._subs.clear()

    # ------------------------------------------------------------------ reads

    def pools(self, model: str | None) -> Pools:
        cached = self._pools.get(model)
        now = self._clock()
        if cached is not None and now - cached[0] < POOLS_CACHE_S:
            return cached[1]
        pools = self._build_pools(model)
        if len(pools.decode) + len(pools.prefill) + len(pools.worker) >= POOLS_CACHE_MIN:
            self._pools[model] = (now, pools)
        else:
            self._pools.pop(model, None)
        return pools

    def _build_pools(self, model: str | None) -> Pools:
        def ready(role: str) -> tuple[Candidate, ...]:
            return tuple(self._candidate(i) for i in self.membership.ready(role) if serves(i, model))

        return Pools(decode=ready(DECODE_ROLE), prefill=ready(PREFILL_ROLE), worker=ready(WORKER_ROLE))

    def _candidate(self, info: InstanceInfo) -> Candidate:
        """candidate_of, kept while the instance's registration and load report are the same objects and the
        report is fresh: a large pool's rebuild then makes new candidates only for the instances that reported."""
        report = self.loads.latest.get(info.instance_id)
        kept = self._cands.get(info.instance_id)
        now = time.monotonic()
        if kept is not None and kept[0] is info and kept[1] is report and now < kept[3]:
            return kept[2]
        cand = candidate_of(info, self.loads, self._max_load_age_s)
        age = self.loads.age_s(info.instance_id)
        # a report counts until it is max_load_age_s old; without one, until one arrives (a new object)
        expiry = now + (self._max_load_age_s - age) if cand.load.known and age is not None else float("inf")
        self._cands[info.instance_id] = (info, report, cand, expiry)
        return cand

    def models(self) -> list[str]:
        """Model names registered by ready decode/worker instances."""
        names = {i.model for role in (DECODE_ROLE, WORKER_ROLE) for i in self.membership.ready(role) if i.model}
        return sorted(names)

    # ------------------------------------------------------------------ events

    def _on_kv_event(self, event: KVEventBatch, meta: Meta) -> None:
        self.router.kv_index.apply(event)

    def _on_membership(self, ev: MembershipEvent) -> None:
        info = ev.instance
        self._pools.clear()
        if ev.kind == EventKind.LEAVE:
            self._cands.pop(info.instance_id, None)
        if info.role in KV_ROLES:
            self._sync_kv(ev)
        if info.role not in ROUTED_ROLES:
            return
        if ev.kind == EventKind.LEAVE:
            self.router.forget(info.instance_id)
            self.loads.latest.pop(info.instance_id, None)
            if self._on_leave is not None:
                self._on_leave(info)
        elif ev.kind == EventKind.JOIN:
            if self._on_join is not None:
                self._on_join(info)
        elif ev.kind == EventKind.UPDATE and ev.previous is not None and ev.previous.epoch != info.epoch:
            # Re-registered (lost lease or restart under the same id): its old cache (see _sync_kv) and failures
            # are history.
            self.router.breakers.remove(info.instance_id)

    def _sync_kv(self, ev: MembershipEvent) -> None:
        info = ev.instance
        if ev.kind == EventKind.LEAVE:
            self.router.kv_index.remove(info.instance_id)
            if self.kv_sync is not None:
                self.kv_sync.forget(info.instance_id)
            return
        if ev.kind == EventKind.UPDATE and ev.previous is not None and ev.previous.epoch != info.epoch:
            self.router.kv_index.forget_older_than(info.instance_id, info.epoch)
        if info.state == InstanceState.READY and self.kv_sync is not None:
            self.kv_sync.want(info.instance_id)  # a no-op when its entry is exact (seen from its first event)
