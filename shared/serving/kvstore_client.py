"""An engine's use of the cluster's kvstore: load a prompt's missed prefix before computing it, store full pages
after, never failing or changing a request.

    client = KVStoreClient(cfg.kvstore_client, ...); await client.start()
    loaded = await client.load(rid, prompt, budget_s)   # before the engine sees the request; 0 on any problem
    client.store_later(tokens, reused=...)              # after it: in the background, bounded, off the TTFT path

load(): Lookup the prompt's pages (with a short lease); when the store holds at least --kvstore-min-pages beyond
the engine's local prefix, take pages from the engine's pool, Get (the store writes into them over the transfer
backend), check every page's CRC-32, hand the good leading pages to the radix cache. Its deadline is derived from
the prompt (a share of what computing the missed tokens costs) unless --kvstore-load-timeout-s sets one; a
timeout, an RPC error, a dead store or a checksum mismatch just means the engine computes those tokens. Pages of a
load that did not finish go to quarantine (the store may still be writing), never back to the pool at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from etcd3aio import Etcd3Client

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from shared.cluster.instance import InstanceInfo
from shared.cluster.membership import Membership
from shared.cluster.tls import TlsFiles, open_channel
from shared.engine.async_engine import AsyncEngine
from shared.modelspec.block_hash import page_hashes
from shared.serving import kvstore_pages as pages
from shared.serving.convert import BACKEND_TO_PB, layout_to_pb
from shared.serving.handoff import descs_from_pb
from shared.serving.kv_transfer import KVTransfer
from shared.telemetry import spans
from shared.telemetry.metrics import CountersCollector
from shared.transfer.checksum import page_crcs

if TYPE_CHECKING:
    from shared.config.groups import KVStoreClientConfig
    from shared.telemetry.service import ServiceTelemetry
from shared.config.choices import KVStoreUse, KVStoreWritePolicy
from shared.transfer.errors import TransferError

log = logging.getLogger(__name__)

# The load deadline, derived: what computing the missed tokens would take at a conservative CPU prefill rate,
# times a share (a load slower than this is not worth waiting for), within [MIN, MAX].
_COMPUTE_S_PER_TOKEN = 1e-3
_LOAD_SHARE = 0.5
_MIN_DEADLINE_S, _MAX_DEADLINE_S = 0.5, 5.0
_QUARANTINE_S = 15.0  # an abandoned load's pages: longer than any store-side deadline (capped at its lease)
_MAX_STORES_IN_FLIGHT = 2
_KNOWN_STORED = 65536  # hashes this client stored recently (skips re-sending them); bounded LRU


# The client's counters for Prometheus: (name, help, attribute).
_COUNTERS = [
    ("pdrelay:kvstore_client_lookups", "Store lookups after a prefix-cache miss", "lookups"),
    ("pdrelay:kvstore_client_loads", "Loads of store pages into the KV pool", "loads"),
    ("pdrelay:kvstore_client_loaded_pages", "Pages loaded from the store and cached", "loaded_pages"),
    ("pdrelay:kvstore_client_load_failures", "Loads that timed out or failed (computed instead)", "load_failures"),
    ("pdrelay:kvstore_client_checksum_failures", "Loaded pages that failed their CRC-32", "checksum_failures"),
    ("pdrelay:kvstore_client_stored_pages", "Pages this engine stored", "stored_pages"),
    ("pdrelay:kvstore_client_store_failures", "Stores that failed (the pages stay local only)", "store_failures"),
]


class KVStoreClient:
    def __init__(
        self,
        cfg: KVStoreClientConfig,
        *,
        instance_id: str,
        model: str,
        etcd: Etcd3Client,
        cluster: str,
        aengine: AsyncEngine,
        transfer: KVTransfer | None,
        make_transfer: Callable[[str], KVTransfer] | None = None,
        telemetry: ServiceTelemetry | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """transfer: the service's own engine over its KV pool (prefill, decode); make_transfer(backend) builds
        one once a store shows up where the service has none (the colocated worker)."""
        self.cfg = cfg
        self.instance_id = instance_id
        self.model = model
        self.aengine = aengine
        self.engine = aengine.engine
        self.page_size = self.engine.page_size
        self.layout = self.engine.runner.layout
        self.transfer = transfer
        self.tls = tls  # the cluster's mutual TLS on the channels to stores
        self.make_transfer = make_transfer
        self.telemetry = telemetry
        self.members = Membership(etcd, cluster, "kvstore")
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stores: set[asyncio.Task[None]] = set()
        self._known: OrderedDict[int, None] = OrderedDict()
        self._making: asyncio.Future[KVTransfer] | None = None
        self._warmed: set[tuple[str, int]] = set()
        self._bg: set[asyncio.Future[Any]] = set()
        # counters (Prometheus, tests)
        self.lookups = 0
        self.loads = 0
        self.loaded_pages = 0
        self.load_failures = 0  # timeouts, RPC errors, dead stores: fell back to computing
        self.checksum_failures = 0  # pages whose bytes did not match the store's CRC: dropped, recomputed
        self.stored_pages = 0
        self.store_skipped = 0  # stores dropped because too many were in flight
        self.store_failures = 0
        if telemetry is not None:
            telemetry.metrics.registry.register(CountersCollector(self, _COUNTERS))

    @property
    def enabled(self) -> bool:
        return self.cfg.kvstore_use != KVStoreUse.OFF

    async def start(self) -> None:
        await self.members.start()
        self.members.on_event(lambda _ev: self._warm_ready())
        self._warm_ready()

    def _warm_ready(self) -> None:
        m = self._pick()
        if m is None or not self.enabled:
            return
        if self.transfer is not None:
            self._warm(m, self.transfer)
        elif self.make_transfer is not None and m.transfer_backend and self._making is None:
            # Built when a store shows up, not by the first request using it (~0.45 s of CPU on 2 cores, beside the
            # engine threads serving it). Started here, not in the task: an event before the task runs sees it.
            self._making = asyncio.ensure_future(asyncio.to_thread(self.make_transfer, m.transfer_backend))
            self._background(self._transfer_for(m))

    async def close(self) -> None:
        for t in [*self._stores, *self._bg]:
            t.cancel()
        await self.members.close()
        for ch in self._channels.values():
            await ch.close()

    # ---- discovery -----------------------------------------------------------------------------------------------
    def _pick(self) -> InstanceInfo | None:
        """A ready store of our namespace (or one not bound yet) and a backend we can speak."""
        want = self.transfer.backend if self.transfer is not None else None
        for m in self.members.ready("kvstore"):
            if want is not None and m.transfer_backend != want:
                continue
            if m.kv_layout is not None and (m.kv_layout != self.layout or m.model != self.model):
                continue
            return m
        return None

    def _warm(self, m: InstanceInfo, transfer: KVTransfer) -> None:
        """Once per store incarnation: an empty Get, so the store loads our endpoint before a request waits on it."""
        key = (m.instance_id, m.epoch)
        if key in self._warmed:
            return
        self._warmed.add(key)

        async def warm() -> None:
            try:
                await self._stub(m).Get(
                    worker_pb2.GetPagesRequest(
                        request_id="warm-up",
                        layout=layout_to_pb(self.layout),
                        model=self.model,
                        destination_peer=transfer.peer_pb(),
                        destination=transfer.descriptors([]),
                    ),
                    timeout=10.0,
                )
            except grpc.aio.AioRpcError as e:
                log.debug("%s: kvstore warm-up with %s: %s", self.instance_id, m.instance_id, e.code().name)

        self._background(warm())

    def _background(self, aw: Any) -> None:
        task = asyncio.ensure_future(aw)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _stub(self, m: InstanceInfo) -> worker_pb2_grpc.KVStoreStub:
        ch = self._channels.get(m.grpc_address)
        if ch is None:
            ch = self._channels[m.grpc_address] = open_channel(m.grpc_address, self.tls)
        return worker_pb2_grpc.KVStoreStub(ch)

    async def _transfer_for(self, m: InstanceInfo) -> KVTransfer | None:
        """Our transfer engine; where the service has none, built once (started by _warm_ready when a store shows
        up, so not on a request's deadline: creating an agent and registering the pool takes a while)."""
        if self.transfer is None and self.make_transfer is not None and m.transfer_backend:
            if self._making is None:
                self._making = asyncio.ensure_future(asyncio.to_thread(self.make_transfer, m.transfer_backend))
            try:
                transfer = await asyncio.shield(self._making)
            except (TransferError, RuntimeError, OSError, ImportError) as e:  # the store is unusable here
                if self.make_transfer is not None:
                    log.warning("%s: no kvstore: its %s agent failed: %s", self.instance_id, m.transfer_backend, e)
                    self.make_transfer = None
                return None
            if self.transfer is None:
                self.transfer = transfer
                transfer.start_progress()
        if self.transfer is not None:
            self._warm(m, self.transfer)
        return self.transfer

    def _deadline_s(self, miss_tokens: int) -> float:
        if self.cfg.kvstore_load_timeout_s > 0:
            return float(self.cfg.kvstore_load_timeout_s)
        return min(_MAX_DEADLINE_S, max(_MIN_DEADLINE_S, _LOAD_SHARE * _COMPUTE_S_PER_TOKEN * miss_tokens))

    # ---- load ----------------------------------------------------------------------------------------------------
    async def load(
        self,
        rid: str,
        prompt: Sequence[int],
        budget_s: float | None = None,
        trace: common_pb2.TraceContext | None = None,
    ) -> int:
        """Load the store's continuation of the local prefix into the pool; returns pages now cached from it.
        Never raises for a store problem: the engine computes whatever was not loaded."""
        if not self.enabled:
            return 0
        hashes = page_hashes(
            prompt[: pages.loadable_pages(len(prompt), self.page_size) * self.page_size], self.page_size
        )
        if len(hashes) < self.cfg.kvstore_min_pages:
            return 0
        store = self._pick()
        if store is None:
            return 0
        transfer = await self._transfer_for(store)
        if transfer is None:
            return 0
        t0 = time.monotonic()
        # The store is asked first, over the whole prompt: on a miss (a cold store, a new prompt) the request then
        # never waits on the engine thread, whose answer (the local prefix) comes only between steps, a whole
        # prefill chunk later at worst. The price: the short lease also covers pages the engine holds itself, and
        # a store missing a prefix's first pages but holding later ones is not used (its eviction drops a
        # prefix's later pages first). The lookup's deadline is derived from the whole prompt; the load's, once
        # the local prefix is known, from the tokens the engine would compute.
        limit = self._deadline_s(len(hashes) * self.page_size)
        if budget_s is not None:
            limit = min(limit, budget_s)
        deadline = t0 + limit
        stub = self._stub(store)
        layout_pb = layout_to_pb(self.layout)
        outcome = "miss"
        cached = 0
        try:
            self.lookups += 1
            resp = await stub.Lookup(
                worker_pb2.LookupRequest(
                    block_hashes=hashes, layout=layout_pb, model=self.model, lease_s=limit + 1.0, trace=trace
                ),
                timeout=max(0.01, deadline - time.monotonic()),
            )
            t_lookup = time.monotonic()
            hit = resp.num_hit_pages
            self._span(
                spans.KVSTORE_LOOKUP, t0, t_lookup, trace, {spans.PAGES: len(hashes), spans.KVSTORE_HIT_PAGES: hit}
            )
            if hit < self.cfg.kvstore_min_pages:
                return 0
            engine = self.engine
            local = await self.aengine.call(lambda: pages.local_prefix(engine, prompt, hashes[:hit]))
            if hit - local < self.cfg.kvstore_min_pages:
                return 0
            deadline = min(deadline, t0 + self._deadline_s((len(hashes) - local) * self.page_size))
            outcome, cached = await self._get(
                rid, stub, store, transfer, prompt, hashes, local, hit - local, deadline, trace
            )
            return cached
        except grpc.aio.AioRpcError as e:
            self.load_failures += 1
            outcome = "timeout" if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "error"
            log.info(
                "%s: kvstore lookup for %s failed (%s); computing the prompt", self.instance_id, rid, e.code().name
            )
            return 0
        finally:
            if outcome != "miss":
                self._span(
                    spans.KVSTORE_LOAD,
                    t0,
                    time.monotonic(),
                    trace,
                    {spans.KVSTORE_OUTCOME: outcome, spans.KVSTORE_LOADED_PAGES: cached},
                )

    async def _get(
        self,
        rid: str,
        stub: worker_pb2_grpc.KVStoreStub,
        store: InstanceInfo,
        transfer: KVTransfer,
        prompt: Sequence[int],
        hashes: list[int],
        local: int,
        n: int,
        deadline: float,
        trace: common_pb2.TraceContext | None,
    ) -> tuple[str, int]:
        engine = self.engine
        want = hashes[local : local + n]
        page_ids = await self.aengine.call(lambda: pages.take_pages(engine, n, keep_free=1))
        if not page_ids:
            return "no_pages", 0
        self.loads += 1
        transfer.begin_receive()
        written = 0
        try:
            resp = await stub.Get(
                worker_pb2.GetPagesRequest(
                    request_id=rid,
                    block_hashes=want,
                    layout=layout_to_pb(self.layout),
                    model=self.model,
                    destination_peer=transfer.peer_pb(),
                    destination=transfer.descriptors(page_ids),
                    deadline_s=max(0.01, deadline - time.monotonic()),
                    trace=trace,
                ),
                timeout=max(0.01, deadline - time.monotonic()),
            )
            written = resp.pages_written
        except (grpc.aio.AioRpcError, TransferError) as e:
            self.load_failures += 1
            code = e.code().name if isinstance(e, grpc.aio.AioRpcError) else str(e)
            log.info("%s: kvstore load of %d pages for %s failed (%s); computing them", self.instance_id, n, rid, code)
            # The store may still be writing into these pages: they are reused only after the quarantine.
            await asyncio.shield(self.aengine.call(lambda: pages.quarantine(engine, page_ids, _QUARANTINE_S)))
            timed_out = isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            return ("timeout" if timed_out else "error"), 0
        except asyncio.CancelledError:  # the request went away mid-load: same as a failed load, then stop
            self._background(self.aengine.call(lambda: pages.quarantine(engine, page_ids, _QUARANTINE_S)))
            raise
        finally:
            transfer.end_receive()
        # Verify what landed, page by page, against the CRC the store committed; keep the good leading run.
        try:
            good = await asyncio.to_thread(_verified_prefix, transfer, page_ids[:written], list(resp.page_checksums))
        except asyncio.CancelledError:  # the write is over: the pages can go straight back
            self._background(self.aengine.call(lambda: pages.free(engine, page_ids)))
            raise
        if good < written:
            self.checksum_failures += written - good
            log.warning(
                "%s: kvstore page %d of %s failed its checksum; dropped, computing from there",
                self.instance_id,
                local + good,
                rid,
            )
        keep, rest = page_ids[:good], page_ids[good:]

        def settle() -> int:
            pages.free(engine, rest)
            return pages.adopt(engine, prompt, hashes, local, keep)

        cached = await asyncio.shield(self.aengine.call(settle))
        self.loaded_pages += cached
        log.debug(
            "%s: loaded %d/%d store pages for %s (transfer %.1f ms)",
            self.instance_id,
            cached,
            n,
            rid,
            resp.transfer_s * 1e3,
        )
        return ("loaded" if good == written and written else "checksum" if good < written else "miss"), cached

    # ---- store ---------------------------------------------------------------------------------------------------
    def wants_store(self, *, finished: bool, reused: bool) -> bool:
        """The write policy: write_through stores prompts after prefill and finished requests; write_back only
        finished requests; selective only requests that reused a cached prefix (the ones likely to come back)."""
        policy = self.cfg.kvstore_write_policy
        if not self.enabled:
            return False
        if policy == KVStoreWritePolicy.WRITE_BACK:
            return finished
        if policy == KVStoreWritePolicy.SELECTIVE:
            return reused
        return True

    def store_later(self, tokens: Sequence[int], trace: common_pb2.TraceContext | None = None) -> None:
        """Store the full computed pages of `tokens` (KV present for all but the last token) in the background."""
        if not self.enabled or len(self._stores) >= _MAX_STORES_IN_FLIGHT:
            self.store_skipped += 1
            return
        task = asyncio.ensure_future(self._store(list(tokens), trace))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    async def _store(self, tokens: list[int], trace: common_pb2.TraceContext | None) -> None:
        store = self._pick()
        if store is None:
            return
        hashes = page_hashes(
            tokens[: pages.loadable_pages(len(tokens), self.page_size) * self.page_size], self.page_size
        )
        if not hashes or all(h in self._known for h in hashes):
            return
        transfer = await self._transfer_for(store)
        if transfer is None:
            return
        engine = self.engine
        t0 = time.monotonic()
        pinned, page_ids = await self.aengine.call(lambda: pages.pin(engine, tokens, hashes))
        stored = 0
        try:
            if pinned:
                stored = await self._put(self._stub(store), transfer, list(pinned), list(page_ids))
        except (grpc.aio.AioRpcError, TransferError) as e:
            self.store_failures += 1
            log.info(
                "%s: kvstore store of %d pages failed (%s)",
                self.instance_id,
                len(pinned),
                e.code().name if isinstance(e, grpc.aio.AioRpcError) else e,
            )
        finally:
            await asyncio.shield(self.aengine.call(lambda: pages.unpin(engine, pinned)))
        self._span(spans.KVSTORE_STORE, t0, time.monotonic(), trace, {spans.PAGES: stored})

    async def _put(
        self, stub: worker_pb2_grpc.KVStoreStub, transfer: KVTransfer, hashes: list[int], page_ids: list[int]
    ) -> int:
        timeout = 10.0
        resp = await stub.Put(
            worker_pb2.PutPagesRequest(
                request_id=f"{self.instance_id}-store",
                block_hashes=hashes,
                layout=layout_to_pb(self.layout),
                model=self.model,
                backend=BACKEND_TO_PB[transfer.backend],
            ),
            timeout=timeout,
        )
        if not resp.put_id:
            self._remember(hashes)
            return 0
        src = [page_ids[i] for i in resp.indexes]
        ok = False
        try:
            # a known store without a thread hop (each wakes a thread beside the engine's on a small box)
            peer = transfer.connected(resp.store_peer)
            if peer is None:
                peer = await asyncio.to_thread(transfer.connect, resp.store_peer)
            dst = descs_from_pb(resp.slots, self.layout)
            handle = transfer.write_pages(peer, src, dst, b"")
            await transfer.wait(handle, max(0.1, resp.expires_s - 1.0))
            crcs = await asyncio.to_thread(page_crcs, transfer.pool.buffer, src)  # host or device pages
            ok = True
        finally:
            if not ok:
                await stub.CommitPut(worker_pb2.CommitPutRequest(put_id=resp.put_id, abort=True), timeout=timeout)
        done = await stub.CommitPut(
            worker_pb2.CommitPutRequest(put_id=resp.put_id, page_checksums=crcs), timeout=timeout
        )
        self.stored_pages += done.pages_stored
        self._remember(hashes)
        return done.pages_stored

    def _remember(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._known[h] = None
            self._known.move_to_end(h)
        while len(self._known) > _KNOWN_STORED:
            self._known.popitem(last=False)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Let background stores finish (a draining service's last conversations are worth keeping)."""
        if self._stores:
            await asyncio.wait(list(self._stores), timeout=timeout_s)

    # ---- tracing -------------------------------------------------------------------------------------------------
    def _span(
        self, name: str, start: float, end: float, trace: common_pb2.TraceContext | None, attributes: dict[str, Any]
    ) -> None:
        """A finished phase as a child of the current span (the prefill.handoff / decode.generate server span the
        request runs in; background stores copied that context when they were scheduled)."""
        tel = self.telemetry
        if tel is None or not tel.tracing.enabled:
            return
        tel.tracing.record(name, start, end, attributes)


def _verified_prefix(transfer: KVTransfer, page_ids: Sequence[int], crcs: Sequence[int]) -> int:
    """Leading pages whose bytes in the pool (host or device memory) match the store's CRC-32."""
    n = min(len(page_ids), len(crcs))
    mine = page_crcs(transfer.pool.buffer, page_ids[:n])
    return next((i for i, (a, b) in enumerate(zip(mine, crcs, strict=False)) if a != b), n)
