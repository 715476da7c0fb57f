"""What every compute service (worker, decode, prefill) shares: the engine, its KV events and load reports.

The engine loads during warm-up (the instance is registered as "starting" meanwhile), then runs one tiny request
so the first real one does not pay for lazy initialisation, and the registration is updated with the model, the KV
layout and the capacity before the instance turns "ready".
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.cluster.bus.cancel import Cancel, subscribe_cancel
from shared.cluster.bus.kv_events import KVEventPublisher
from shared.cluster.bus.kv_snapshot import KVSnapshotServer
from shared.cluster.bus.load import LoadSnapshot
from shared.cluster.instance import Capacity
from shared.config.choices import EngineKind
from shared.config.groups import EncoderConfig
from shared.config.resolved import ResolvedConfig
from shared.engine.async_engine import AsyncEngine
from shared.engine.encoder_cache import EncoderCache
from shared.engine.engine import Engine, EngineStats
from shared.engine.models import load_model_config
from shared.engine.radix_cache import AllPagesCleared, KVEvent, PagesEvicted, PagesStored
from shared.engine.vision_runner import VisionEncoderRunner
from shared.modelspec.sampling import SamplingParams
from shared.service import Service, ServiceConfig, ServiceOptions
from shared.serving.device_start import start_on_device
from shared.serving.media import LocalVision
from shared.telemetry import spans
from shared.telemetry.metrics import EngineCollector
from shared.telemetry.tracing import SpanKind, extract

if TYPE_CHECKING:
    from shared.serving.kvstore_client import KVStoreClient

log = logging.getLogger(__name__)


class RequestIds:
    """Gateway request id <-> engine request ids. A retry keeps the request id and bumps the attempt, and the
    old attempt may still be winding down here, so the engine sees `<request_id>@<attempt>` (unique)."""

    def __init__(self) -> None:
        self._by_request: dict[str, set[str]] = {}

    def open(self, request_id: str, attempt: int) -> str:
        rid = f"{request_id}@{attempt}"
        self._by_request.setdefault(request_id, set()).add(rid)
        return rid

    def close(self, request_id: str, rid: str) -> None:
        ids = self._by_request.get(request_id)
        if ids is not None:
            ids.discard(rid)
            if not ids:
                del self._by_request[request_id]

    def engine_ids(self, request_id: str) -> list[str]:
        return sorted(self._by_request.get(request_id, ()))


class _Rate:
    """Tokens per second over a sliding window, for load reports."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self._t0 = time.monotonic()
        self._n0 = 0
        self.value = 0.0

    def update(self, total: int) -> float:
        now = time.monotonic()
        if now - self._t0 >= self.window_s:
            self.value = (total - self._n0) / (now - self._t0)
            self._t0, self._n0 = now, total
        return self.value


class _StepWindow:
    """Engine step metrics over a sliding window (load reports): mean step time, busy share, compute rate."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self._mark: tuple[float, float, int, int] | None = None  # (monotonic, busy s, steps, tokens)
        self.step_ms = 0.0
        self.busy = 0.0
        self.tokens_per_s = 0.0  # per second of step time; kept from the last window that ran steps

    def update(self, stats: EngineStats, busy: bool = False) -> None:
        """`busy`: the engine has work right now (a window without a finished step is then one long step)."""
        t = stats.totals
        now = time.monotonic()
        cur = (now, t.schedule_s + t.prepare_s + t.forward_s + t.sample_s + t.update_s, stats.num_steps, t.num_tokens)
        if self._mark is None or cur[2] < self._mark[2]:  # first call, or the stats were reset
            self._mark = cur
            return
        dt = now - self._mark[0]
        if dt < self.window_s:
            return
        busy_s, steps, tokens = cur[1] - self._mark[1], cur[2] - self._mark[2], cur[3] - self._mark[3]
        if not steps and busy:
            return  # one step longer than the window is still running: keep the last numbers, not "idle"
        self.busy = min(1.0, busy_s / dt)
        self.step_ms = busy_s / steps * 1e3 if steps else 0.0
        if busy_s > 0 and tokens:
            self.tokens_per_s = tokens / busy_s
        self._mark = cur


class EngineService(Service):
    """Base of the worker, decode and prefill services. Subclasses add their gRPC servicers."""

    def __init__(self, cfg: ResolvedConfig, options: ServiceOptions = ServiceOptions()) -> None:
        if cfg.engine.engine != EngineKind.MOCK and Path(cfg.model.model).is_dir():
            # an unsupported model is refused now, in one line naming the field (serve_role prints the ValueError),
            # not after the control plane is joined and the weights start loading
            load_model_config(cfg.model.model)
        super().__init__(ServiceConfig.of(cfg), options)
        self.cfg = cfg
        self.engine: Engine | None = None
        self.aengine: AsyncEngine | None = None
        self.vision: LocalVision | None = None  # this process's own vision tower (vision-language models)
        self.ids = RequestIds()
        self.kvstore: KVStoreClient | None = None  # the cluster's kvstore, once attached (engine roles that use one)
        self._kv_pub: KVEventPublisher | None = None
        self._kv_snapshots: KVSnapshotServer | None = None
        self._rate = _Rate()
        self._steps = _StepWindow()
        self.telemetry.metrics.registry.register(
            EngineCollector(lambda: self.aengine.stats() if self.aengine is not None else None)
        )

    # ---- warm-up -----------------------------------------------------------------------------------------------
    def build_engine(self) -> Engine:
        """Runs on the engine thread (AsyncEngine.build): loading weights takes seconds and must not block the
        event loop."""
        if self.cfg.engine.engine == EngineKind.MOCK:
            from shared.engine.mock import build_mock_engine

            return build_mock_engine(self.cfg, on_kv_event=self._on_kv_event)
        self.cfg = start_on_device(self.cfg)  # its own GPU, and the plan checked before any weight loads
        return Engine.from_config(self.cfg, on_kv_event=self._on_kv_event)

    def build_vision(self, engine: Engine) -> LocalVision | None:
        """The vision tower of a vision-language model: the worker and prefill encode with it (prefill when no
        encoder answers), decode when it prefills a prompt itself (no prefill target). Runs on the engine thread."""
        runner = engine.runner
        if getattr(runner, "llava", None) is None:
            return None
        from shared.engine.model_runner import ModelRunner

        assert isinstance(runner, ModelRunner)  # only the model runner loads a vision tower
        enc = EncoderConfig()  # engine roles have no encoder group: the in-process cache takes its default sizes
        cache = EncoderCache(max_items=enc.encoder_cache_items, max_bytes=enc.encoder_cache_bytes)
        return LocalVision(
            VisionEncoderRunner(runner.model_dir, dtype=_dtype_name(runner.dtype), device=str(runner.device)), cache
        )

    async def warm_up(self) -> None:
        t0 = time.monotonic()
        # built on the engine thread, which then runs every torch op of the engine (one OpenMP team: async_engine)
        self.aengine = await AsyncEngine.build(self.build_engine, stream_interval=self.cfg.scheduler.stream_interval)
        loop = asyncio.get_running_loop()

        def lost(e: BaseException) -> None:
            loop.call_soon_threadsafe(self._engine_lost, e)

        self.aengine.on_lost = lost
        self.engine = self.aengine.engine
        engine = self.engine
        self.vision = await self.aengine.call(lambda: self.build_vision(engine))
        assert self.bus is not None  # connected in start(), before the engine
        self._kv_pub = KVEventPublisher(
            self.bus,
            self.cluster,
            self.instance_id,
            epoch=self.epoch,
            page_size=self.engine.page_size,
            layout_kind=self.engine.runner.layout.kind,
        )
        # gateways that start later rebuild their KV index from this (kv_snapshot.py)
        self._kv_snapshots = KVSnapshotServer(
            self.bus, self.cluster, self.instance_id, lambda: self._kv_pub, lambda: self.epoch
        )
        await self._kv_snapshots.start()
        await subscribe_cancel(self.bus, self.cluster, self._on_cancel)
        await self._warm_request()
        await self.after_engine()
        assert self.registrar is not None
        await self.registrar.update(**self.describe())
        log.info(
            "%s: engine ready in %.1f s (%d KV pages of %d tokens)",
            self.instance_id,
            time.monotonic() - t0,
            self.engine.runner.num_pages,
            self.engine.page_size,
        )

    def _engine_lost(self, e: BaseException) -> None:
        """The engine cannot step again (a tensor-parallel rank died or hung): its streams have ended with a
        retryable error, which the gateway replays elsewhere; the instance deregisters and exits 1 at once, so it
        neither stays listed nor waits out its lease, and `pdrelay up`'s supervisor starts it again."""
        log.error("%s: engine lost (%s); stopping this instance", self.instance_id, e)
        self.exit_code = 1
        self.request_drain(f"engine lost: {e}")
        self.request_drain("engine lost")  # the second request stops waiting for in-flight work: there is none

    async def after_engine(self) -> None:
        """Hook for subclasses: set up what needs the engine (transfer engine, peers) before "ready"."""

    async def _warm_request(self) -> None:
        assert self.aengine is not None
        async for _ in self.aengine.generate(
            f"warmup-{self.instance_id}", [1, 2, 3, 4], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        ):
            pass
        self.aengine.engine.reset_stats()

    # ---- registration and load ---------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.cfg.model.served_model_name or self.cfg.model.model}
        if self.engine is not None:
            runner = self.engine.runner
            d["kv_layout"] = runner.layout
            d["capacity"] = Capacity(
                max_running_requests=self.cfg.scheduler.max_running_requests,
                num_pages=runner.num_pages,
                page_size=self.engine.page_size,
                tp_size=self.cfg.parallel.tp_size,
            )
        return d

    def load_snapshot(self) -> LoadSnapshot | None:
        if self.aengine is None:
            return LoadSnapshot(running=self.gate.inflight)
        s = self.aengine.stats()
        queued_tokens = self._queued_prefill_tokens()
        self._steps.update(s, busy=bool(s.num_running or s.num_waiting))
        # Free = what a new request could get: free pages plus cached pages nobody holds. Cached pages that running,
        # arriving (hand-off) or held requests use are not free, nor are quarantined ones.
        return LoadSnapshot(
            running=s.num_running,
            queued=s.num_waiting,
            queued_prefill_tokens=queued_tokens,
            free_pages=s.num_free_pages + s.num_evictable_pages,
            total_pages=s.num_total_pages,
            tokens_per_s=self._rate.update(s.num_generated_tokens + s.num_prompt_tokens),
            pending_prefill_tokens=queued_tokens + self._unfinished_prompt_tokens(),
            step_ms=self._steps.step_ms,
            busy=self._steps.busy,
            compute_tokens_per_s=self._steps.tokens_per_s,
            kv_seq=self._kv_pub.seq if self._kv_pub is not None else 0,
        )

    def _queued_prefill_tokens(self) -> int:
        assert self.aengine is not None
        # A racy read of the engine thread's queue is fine for a load estimate; never let it break the report.
        try:
            return self.aengine.engine.scheduler.queued_prompt_tokens
        except RuntimeError:  # the queue changed under us; report 0 this time
            return 0

    def _unfinished_prompt_tokens(self) -> int:
        assert self.aengine is not None
        try:  # racy read of the engine thread's list, as above
            return sum(
                max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in list(self.aengine.engine.scheduler.running)
            )
        except RuntimeError:
            return 0

    async def on_epoch(self, epoch: int) -> None:
        if self._kv_pub is not None:
            self._kv_pub.set_epoch(epoch)

    # ---- events ------------------------------------------------------------------------------------------------
    def _on_kv_event(self, ev: KVEvent) -> None:
        """Radix-cache callback (engine thread): publish on NATS for the gateway's KV index."""
        pub = self._kv_pub
        if pub is None:
            return
        if isinstance(ev, PagesStored):
            pub.stored(ev.hashes)
        elif isinstance(ev, PagesEvicted):
            pub.evicted(ev.hashes)
        elif isinstance(ev, AllPagesCleared):
            pub.cleared()

    async def _on_cancel(self, msg: Cancel, meta: object) -> None:
        if self.aengine is None:
            return
        engine_ids = self.ids.engine_ids(msg.request_id)
        for rid in engine_ids:
            log.info("%s: cancel %s (%s)", self.instance_id, rid, msg.reason or "no reason")
            self.aengine.abort(rid)
        tr = self.telemetry.tracing
        # A span in the cancelled request's trace, whose context came in the NATS message headers (every engine
        # instance receives the cancel; `aborted` says whether this one held work for the request).
        parent = extract(getattr(meta, "headers", None)) if tr.enabled else None
        if parent is not None:
            now = time.monotonic()
            tr.record(
                spans.REQUEST_CANCEL,
                now,
                now,
                {
                    spans.REQUEST_ID: msg.request_id,
                    spans.INSTANCE: self.instance_id,
                    "pdrelay.cancel.reason": msg.reason,
                    "pdrelay.cancel.origin": msg.origin,
                    "pdrelay.cancel.aborted": len(engine_ids),
                },
                parent=parent,
                kind=SpanKind.CONSUMER,
            )

    async def on_stop(self) -> None:
        if self._kv_snapshots is not None:
            await self._kv_snapshots.close()
        if self._kv_pub is not None:
            await self._kv_pub.close()
        if self.aengine is not None:
            await asyncio.to_thread(self.aengine.shutdown)


def _dtype_name(dtype: Any) -> str:
    """torch.bfloat16 -> 'bfloat16': the model's dtype (the KV layout's may be fp8)."""
    return str(dtype).removeprefix("torch.")
