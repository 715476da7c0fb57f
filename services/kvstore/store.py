"""The store behind the KVStore RPCs: one key namespace (model + KV layout), the DRAM arena registered with the
transfer engine, the disk tier below it, and the KV events that tell the gateway what it holds.

The namespace is bound by the first caller (the arena's slot size is that layout's page size) and published in
the store's etcd registration; a caller of another model or layout is refused (LAYOUT_MISMATCH), never mixed in.
Page bytes move only through the transfer engine: callers write their pages into arena slots (Put), the store
writes arena slots into callers' pages (Get).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from proto.pdrelay.v1 import common_pb2, worker_pb2
from services.kvstore.arena import DramArena, Read, Reservation
from shared.engine.hostmem import alloc_host_buffer, populate_in_background
from shared.modelspec.kv_layout import KVLayout
from shared.serving.convert import BACKEND_TO_PB
from shared.serving.handoff import paged_descriptors
from shared.transfer import create_engine
from shared.transfer.base import TransferEngine, TransferHandle
from shared.transfer.descs import PageDesc, RegionHandle
from shared.transfer.errors import TransferError, TransferTimeout
from shared.transfer.options import TransferOptions
from shared.transfer.pace import ProgressPace

if TYPE_CHECKING:
    from services.kvstore.disk import DiskTier
    from services.kvstore.remote import MooncakeTier

log = logging.getLogger(__name__)


class LayoutMismatch(ValueError):
    """A caller's model or KV layout differs from the namespace this store serves."""


@dataclass(frozen=True)
class Namespace:
    model: str
    layout: KVLayout

    def describe(self) -> str:
        lay = self.layout
        heads = f"{lay.num_kv_heads} KV heads" if lay.kind == "mha" else "latent rows (mla)"
        return (
            f"model {self.model!r} ({lay.dtype}, page size {lay.page_size}, {lay.num_layers} layers, "
            f"{heads}, head dim {lay.head_dim})"
        )


@dataclass
class StoreCounters:
    lookups: int = 0
    lookup_pages: int = 0  # pages asked about
    hit_pages: int = 0  # of those, held (leading)
    get_pages: int = 0  # pages written out by Get
    get_failures: int = 0  # Gets whose transfer failed or timed out
    promoted_pages: int = 0  # disk -> DRAM on a hit
    remote_promoted_pages: int = 0  # Mooncake Store -> DRAM on a lookup


class PageStore:
    """Tiers + transfer engine. Call from one event loop; the engine's own lock covers its threads."""

    def __init__(
        self,
        *,
        name: str,
        backend: str,
        host: str,
        dram_bytes: int,
        lease_s: float,
        high_watermark: float,
        disk: DiskTier | None = None,
        remote: MooncakeTier | None = None,
        on_stored: Callable[[Sequence[int]], None] | None = None,
        on_removed: Callable[[Sequence[int]], None] | None = None,
        options: TransferOptions | None = None,
    ) -> None:
        self.backend = backend
        self.dram_bytes = dram_bytes
        self.lease_s = lease_s
        self.high_watermark = high_watermark
        self.disk = disk
        self.remote = remote
        self.on_stored = on_stored
        self.on_removed = on_removed
        self.engine: TransferEngine = create_engine(backend, name=name, host=host, options=options)
        self.namespace: Namespace | None = None
        self.arena: DramArena | None = None
        self.region: RegionHandle | None = None
        self._buffer: torch.Tensor | None = None
        self._endpoint = b""
        self.counters = StoreCounters()
        self._pace = ProgressPace()  # progress fast while a Get writes or a Put is reserved
        self._progress: asyncio.Task[None] | None = None
        self._bound_hooks: list[Callable[[Namespace], None]] = []

    # ---- namespace ---------------------------------------------------------------------------------------------
    def on_bound(self, hook: Callable[[Namespace], None]) -> None:
        self._bound_hooks.append(hook)

    def check(self, model: str, layout: KVLayout) -> DramArena:
        """The arena for (model, layout): binds the namespace on first use, refuses any other afterwards."""
        ns = Namespace(model, layout)
        if self.namespace is None:
            self._bind(ns)
        elif ns != self.namespace:
            raise LayoutMismatch(
                f"this kvstore holds pages of {self.namespace.describe()}, not of {ns.describe()}; "
                "run one kvstore per model and KV layout"
            )
        assert self.arena is not None
        return self.arena

    def allocate(self) -> None:
        """The DRAM tier's memory, registered with the transfer engine once (seconds for GiBs: at start, in a
        worker thread, not on a caller's deadline); the namespace's slots are carved from it when bound."""
        if self.dram_bytes <= 0:
            raise ValueError("--kvstore-dram-bytes 0 leaves no DRAM tier; the store needs one (e.g. 1GiB)")
        self._buffer = alloc_host_buffer([self.dram_bytes], torch.uint8)
        self.region = self.engine.register(self._buffer)
        # Fault the tier in now, while the cluster starts: a slot's first Put otherwise faults its huge pages in
        # inside the caller's process_vm_writev, i.e. in the engine's transfer call on its event loop. Measured on
        # the colocated worker, 64 stores of ~9 MB into fresh slots spent ~19 ms each there (~1.2 s a run) and
        # cut served output tok/s by ~10% on varied lengths (where finished requests store one by one).
        populate_in_background(self._buffer, "kvstore DRAM tier")
        self._endpoint = self.engine.endpoint()

    def _bind(self, ns: Namespace) -> None:
        page_bytes = ns.layout.page_bytes
        evict_hook = self._demote if (self.disk is not None or self.remote is not None) else None
        if self._buffer is None:
            self.allocate()
        self.arena = DramArena(
            self.dram_bytes, page_bytes, lease_s=self.lease_s, evict_hook=evict_hook, buffer=self._buffer
        )
        self.namespace = ns
        if self.disk is not None:
            self.disk.bind(ns.model, ns.layout)
        if self.remote is not None:
            self.remote.bind(ns.model, ns.layout)
        log.info("kvstore: serving %s: %d DRAM slots of %d bytes", ns.describe(), self.arena.num_slots, page_bytes)
        for hook in self._bound_hooks:
            hook(ns)

    # ---- peers ---------------------------------------------------------------------------------------------------
    def peer_pb(self) -> common_pb2.TransferPeer:
        return common_pb2.TransferPeer(
            backend=BACKEND_TO_PB[self.backend], agent_name=self.engine.name, agent_metadata=self._endpoint
        )

    def slots_pb(self, slots: Sequence[int]) -> common_pb2.PageDescriptors:
        assert self.region is not None and self.arena is not None
        return paged_descriptors(self.region.addr, self.arena.page_bytes, list(slots))

    def start(self) -> None:
        self._progress = asyncio.ensure_future(self._progress_loop())
        if self.remote is not None:
            self.remote.start()

    def _demote(self, h: int, page: torch.Tensor, crc: int) -> None:
        if self.disk is not None:
            self.disk.demote(h, page, crc)
        if self.remote is not None:
            self.remote.demote(h, page, crc)

    async def _progress_loop(self) -> None:
        # The receiving side of a Put must progress its backend (NIXL/UCX), or a caller's write never completes.
        while True:
            try:
                self.engine.notifications()
            except TransferError as e:
                log.warning("kvstore transfer progress: %s", e)
            self._maintain()
            # A reserved Put is fast-paced until it is committed, aborted or expired (a writer that died), so a
            # lost commit cannot leave the store progressing at the fast pace for good.
            await self._pace.nap(busy=self.arena is not None and self.arena.pending_puts > 0)

    def _maintain(self) -> None:
        arena = self.arena
        if arena is None:
            return
        arena.expire()
        over = arena.over_watermark(self.high_watermark)
        if over:
            arena.evict(over)  # demotes through evict_hook when there is a disk tier
        self._publish_removed()

    def _publish_removed(self) -> None:
        assert self.arena is not None
        gone = self.arena.take_removed()
        if self.disk is not None:
            gone = [h for h in gone if h not in self.disk]  # demoted pages are still in the store
            gone.extend(self.disk.take_removed())
        if self.remote is not None:
            gone = [h for h in gone if h not in self.remote]
            gone.extend(
                h
                for h in self.remote.take_removed()
                if h not in self.arena and (self.disk is None or h not in self.disk)
            )
        if gone and self.on_removed is not None:
            self.on_removed(gone)

    # ---- operations ----------------------------------------------------------------------------------------------
    async def lookup(
        self, model: str, layout: KVLayout, hashes: Sequence[int], lease_s: float
    ) -> list[worker_pb2.StorageTier]:
        """Tier of each leading held page (DRAM, DISK, PEER for the Mooncake Store). Pages only the Mooncake Store
        holds are promoted into DRAM here (under the lookup's lease), so the Get that follows serves them as usual."""
        arena = self.check(model, layout)
        self.counters.lookups += 1
        self.counters.lookup_pages += len(hashes)
        n = arena.lookup(hashes, lease_s)
        tiers: list[worker_pb2.StorageTier] = [worker_pb2.STORAGE_TIER_DRAM] * n
        if self.disk is not None and n < len(hashes):
            tiers += [worker_pb2.STORAGE_TIER_DISK] * self.disk.lookup(hashes[n:])
        if self.remote is not None and len(tiers) < len(hashes):
            got = await self._promote_remote(hashes[len(tiers) :], lease_s)
            tiers += [worker_pb2.STORAGE_TIER_PEER] * got
        self.counters.hit_pages += len(tiers)
        return tiers

    async def _promote_remote(self, hashes: Sequence[int], lease_s: float) -> int:
        arena, remote = self.arena, self.remote
        assert arena is not None and remote is not None
        # at most what DRAM can take without evicting the pages this lookup already counts
        got = await remote.fetch(hashes, limit=max(0, arena.num_slots // 2))
        if not got:
            return 0
        res = arena.reserve([h for h, _, _ in got])
        crcs = []
        for idx, slot in zip(res.indexes, res.slots, strict=True):
            arena.slot_view(slot).copy_(got[idx][1])
            crcs.append(got[idx][2])
        stored: list[int] = []
        if res.put_id:
            stored, _ = arena.commit(res.put_id, crcs)
        self.counters.remote_promoted_pages += len(stored)
        if stored and self.on_stored is not None:
            self.on_stored(stored)
        self._publish_removed()
        return arena.lookup([h for h, _, _ in got], lease_s)

    def reserve(self, model: str, layout: KVLayout, hashes: Sequence[int]) -> Reservation:
        arena = self.check(model, layout)
        res = arena.reserve(hashes)
        self._publish_removed()
        if res.put_id:
            self._pace.wake()
        return res

    def commit(self, put_id: int, crcs: Sequence[int], abort: bool) -> tuple[int, int]:
        arena = self.arena
        if arena is None:
            return 0, 0
        if abort:
            arena.abort(put_id)
            return 0, 0
        stored, rejected = arena.commit(put_id, crcs)
        if stored and self.on_stored is not None:
            self.on_stored(stored)
        if self.disk is not None:
            self.disk.forget(stored)  # a fresher copy is in DRAM now
        return len(stored), rejected

    async def get(
        self,
        model: str,
        layout: KVLayout,
        hashes: Sequence[int],
        peer: common_pb2.TransferPeer,
        dst: Sequence[PageDesc],
        deadline: float,
    ) -> tuple[Read, float]:
        """Write the leading held pages into the caller's pages; returns the verified read and the transfer time.
        Raises TransferError / TransferTimeout (nothing is written after the deadline starts a new write)."""
        arena = self.check(model, layout)
        n = min(len(hashes), len(dst))
        await self._promote(hashes[:n])
        read = arena.begin_read(hashes[:n])
        self._publish_removed()
        if not read.hashes:
            if not hashes and peer.agent_metadata:  # a caller's warm-up: load its endpoint now, not on a deadline
                await asyncio.to_thread(self.engine.connect, peer.agent_metadata)
            return read, 0.0
        self._pace.begin()
        try:
            peer_id = await asyncio.to_thread(self.engine.connect, peer.agent_metadata)
            if time.monotonic() >= deadline:
                raise TransferTimeout("kvstore Get: deadline passed before the write started")
            assert self.region is not None
            t0 = time.monotonic()
            src = self.engine.describe_pages(self.region, read.slots, arena.page_bytes)
            handle = self.engine.write(peer_id, src, list(dst[: len(read.slots)]))
            await self._wait(handle, deadline)
            took = time.monotonic() - t0
        except (TransferError, TransferTimeout):
            self.counters.get_failures += 1
            raise
        finally:
            self._pace.end()
            arena.end_read(read)
        self.counters.get_pages += len(read.hashes)
        return read, took

    async def _promote(self, hashes: Sequence[int]) -> None:
        """Pages of a Get that sit on disk come back into DRAM first (the transfer engine reads only DRAM)."""
        arena, disk = self.arena, self.disk
        if disk is None or arena is None:
            return
        start = arena.lookup(hashes)
        if start >= len(hashes):
            return
        got = await asyncio.to_thread(disk.read_pages, hashes[start:])
        if not got:
            return
        res = arena.reserve([h for h, _ in got])
        crcs = []
        for idx, slot in zip(res.indexes, res.slots, strict=True):
            h, data = got[idx]
            arena.slot_view(slot).copy_(data)
            crcs.append(disk.crc_of(h))
        if res.put_id:
            stored, _ = arena.commit(res.put_id, crcs)
            disk.forget(stored)
            self.counters.promoted_pages += len(stored)

    async def _wait(self, handle: TransferHandle, deadline: float) -> None:
        delay = 0.0
        while True:
            status = self.engine.poll(handle)
            if status == "done":
                return
            if status == "error":
                raise TransferError(f"kvstore write of {handle.nbytes} bytes to {handle.peer!r} failed")
            if time.monotonic() >= deadline:
                raise TransferTimeout(
                    f"kvstore write of {handle.nbytes} bytes to {handle.peer!r} not done by its deadline"
                )
            await asyncio.sleep(delay)
            delay = min(0.001, delay + 0.0001)

    # ---- state ---------------------------------------------------------------------------------------------------
    def tiers(self) -> list[tuple[worker_pb2.StorageTier, int, int, int]]:
        """(tier, used bytes, capacity bytes, pages) per tier."""
        out = []
        a = self.arena
        out.append(
            (
                worker_pb2.STORAGE_TIER_DRAM,
                a.used_bytes if a else 0,
                a.capacity_bytes if a else self.dram_bytes,
                a.num_pages if a else 0,
            )
        )
        if self.disk is not None:
            out.append(
                (worker_pb2.STORAGE_TIER_DISK, self.disk.used_bytes, self.disk.capacity_bytes, self.disk.num_pages)
            )
        if self.remote is not None:
            r = self.remote
            out.append((worker_pb2.STORAGE_TIER_PEER, r.used_bytes, r.capacity_bytes, r.num_pages))
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"tiers": self.tiers(), "counters": self.counters}

    async def close(self) -> None:
        if self._progress is not None:
            self._progress.cancel()
        try:
            self.engine.close()
        except TransferError as e:
            log.warning("closing the kvstore transfer engine: %s", e)
        if self.disk is not None:
            self.disk.close()
        if self.remote is not None:
            await self.remote.close()
