"""Load reports: every ~200 ms each worker says how busy it is; routers and `pdrelay status` keep the latest.

A report that would repeat the last one is held back until a heartbeat is due (every k-th interval, k <= 5, at most
0.5 s apart: every 0.4 s at the default 0.2 s): an idle cluster's services otherwise wake every receiver (gateway,
planner, NATS) five times a second each, and a wake-up costs ~200 us of CPU on the small VMs this runs on, on the
cores the engines need. Readers treat a report as fresh for 1-2 s and `pdrelay status` listens for 0.6 s, so a
heartbeat every 0.5 s at most keeps an idle instance visible. Counted in intervals, not timed: a timed heartbeat
lands on the first tick after it is due, 0.6 s at the default."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.client import Bus, Handler, Meta

log = logging.getLogger(__name__)


class TierFill(msgspec.Struct, frozen=True, array_like=True):
    """One storage tier of a kvstore: "dram" | "disk" | "peer"."""

    tier: str
    used_bytes: int
    capacity_bytes: int
    pages: int


class LoadSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What a service measures about itself; the reporter adds identity, sequence and time."""

    running: int = 0  # requests in the running batch (or in-flight RPCs)
    queued: int = 0  # requests waiting for admission
    queued_prefill_tokens: int = 0  # prompt tokens waiting (prefill routing cost)
    free_pages: int = 0
    total_pages: int = 0
    tokens_per_s: float = 0.0  # generated (decode) or computed (prefill) tokens per second, recent average
    # Engine step metrics over the last few seconds (the planner's inputs; 0 where unknown):
    pending_prefill_tokens: int = 0  # prompt tokens not computed yet: waiting requests and unfinished chunks
    step_ms: float = 0.0  # mean step time (a decode instance's inter-token latency)
    busy: float = 0.0  # share of wall time spent in steps (0..1)
    compute_tokens_per_s: float = 0.0  # tokens computed per second of step time: what the instance can do
    tiers: tuple[TierFill, ...] = ()  # kvstore: fill of each storage tier
    # the last KV event sequence number published (kv_events.py): a gateway whose KV index stays behind it has lost
    # an event that no later event would reveal
    kv_seq: int = 0


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    role: str
    epoch: int
    seq: int
    ts: float  # unix seconds
    load: LoadSnapshot


class LoadReporter:
    """Publishes `snapshot()` every `interval_s` on `pdrelay.<cluster>.load.<instance>` until closed."""

    def __init__(
        self,
        bus: Bus,
        cluster: str,
        instance_id: str,
        role: str,
        snapshot: Callable[[], LoadSnapshot],
        *,
        interval_s: float = 0.2,
        epoch: Callable[[], int] | int = 0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"load report interval must be > 0 s (got {interval_s}); try 0.2")
        self._bus = bus
        self._subject = subjects.load(cluster, instance_id)
        self._instance_id, self._role = instance_id, role
        self._snapshot = snapshot
        self._interval = interval_s
        self._epoch = epoch
        self._seq = 0
        self._every = max(1, min(5, int(0.5 / interval_s + 1e-9)))  # heartbeat: every k-th tick at least
        self._last: tuple[LoadSnapshot, int] | None = None  # what was last published, with its epoch
        self._held = 0  # ticks held back since then
        self._task: asyncio.Task[None] | None = None

    def start(self) -> LoadReporter:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"load-reporter-{self._instance_id}")
        return self

    async def report_now(self, *, unless_repeat: bool = False) -> bool:
        """Publish the current snapshot; with `unless_repeat` (the periodic reports), not when it equals the last one
        published and the heartbeat is not due yet."""
        epoch = self._epoch() if callable(self._epoch) else self._epoch
        try:
            snap = self._snapshot()
        except Exception:  # a broken probe must not stop the reports of the others
            log.exception("load snapshot of %s failed", self._instance_id)
            return False
        if unless_repeat and self._last == (snap, epoch) and self._held + 1 < self._every:
            self._held += 1
            return False
        self._seq += 1
        self._last, self._held = (snap, epoch), 0
        report = LoadReport(
            instance_id=self._instance_id, role=self._role, epoch=epoch, seq=self._seq, ts=time.time(), load=snap
        )
        return await self._bus.publish(self._subject, report)

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self.report_now(unless_repeat=True)
            await asyncio.sleep(max(0.0, self._interval - (time.monotonic() - started)))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


class LoadTable:
    """The latest report per instance, from a wildcard subscription; `fresh(max_age_s)` ignores silent ones."""

    def __init__(self) -> None:
        self.latest: dict[str, LoadReport] = {}
        self.received_at: dict[str, float] = {}  # monotonic
        self._sub: Subscription | None = None

    def _on_report(self, report: LoadReport, meta: Meta) -> None:
        prev = self.latest.get(report.instance_id)
        # a late report from an older epoch (or an older seq) must not overwrite a newer one
        if prev is not None and (report.epoch, report.seq) < (prev.epoch, prev.seq):
            return
        self.latest[report.instance_id] = report
        self.received_at[report.instance_id] = time.monotonic()

    async def subscribe(self, bus: Bus, cluster: str) -> LoadTable:
        self._sub = await subscribe_load(bus, cluster, self._on_report)
        return self

    def age_s(self, instance_id: str) -> float | None:
        t = self.received_at.get(instance_id)
        return None if t is None else time.monotonic() - t

    def fresh(self, max_age_s: float = 1.0) -> dict[str, LoadReport]:
        now = time.monotonic()
        return {k: v for k, v in self.latest.items() if now - self.received_at[k] <= max_age_s}

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None


async def subscribe_load(
    bus: Bus, cluster: str, handler: Handler[LoadReport], instance_id: str = subjects.ANY
) -> Subscription:
    return await bus.subscribe(subjects.load(cluster, instance_id), LoadReport, handler)
