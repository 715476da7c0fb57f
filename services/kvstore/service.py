"""The kvstore service: registers as role kvstore (address, tiers, capacity, the namespace it serves), reports
load and tier fill over NATS, publishes KV events (tier "host") for the gateway's index, drains on SIGTERM.

The store itself is services/kvstore/store.py; the RPCs are services/kvstore/servicer.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import torch

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.kvstore.disk import open_disk_tier
from services.kvstore.remote import MooncakeTier
from services.kvstore.servicer import KVStoreServicer, stats_pb
from services.kvstore.store import Namespace, PageStore
from shared.cluster.bus.kv_events import KVEventPublisher
from shared.cluster.bus.kv_snapshot import KVSnapshotServer
from shared.cluster.bus.load import LoadSnapshot, TierFill
from shared.cluster.instance import Capacity
from shared.config.groups import KVStoreConfig
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role
from shared.service import Service, ServiceConfig, ServiceOptions
from shared.serving.kv_transfer import transfer_options
from shared.telemetry.metrics import CountersCollector
from shared.telemetry.tracing import SpanKind, extract

log = logging.getLogger(__name__)

STORE_TIER = "host"  # the KV-event tier of every page the store holds (DRAM or its disk: one transfer away)


def open_remote_tier(k: KVStoreConfig, host: str) -> MooncakeTier | None:
    """T3 from the config, or None when --kvstore-mooncake-master is unset. ValueError names a bad flag."""
    if not k.kvstore_mooncake_master:
        return None
    master = k.kvstore_mooncake_master
    _, sep, port = master.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--kvstore-mooncake-master {master!r} is not HOST:PORT")
    if not k.kvstore_mooncake_metadata_url:
        raise ValueError(
            "--kvstore-mooncake-master needs --kvstore-mooncake-metadata-url (the master's HTTP "
            "metadata server, e.g. http://HOST:8080/metadata)"
        )
    return MooncakeTier(
        master=master,
        metadata_url=k.kvstore_mooncake_metadata_url,
        host=host,
        segment_bytes=k.kvstore_mooncake_segment_bytes,
        budget_bytes=k.kvstore_mooncake_bytes,
        chunk_pages=k.kvstore_chunk_pages,
        timeout_s=k.kvstore_mooncake_timeout_s,
    )


# The store's counters as Prometheus metrics: (name, help, the attribute `__getattr__` reads at scrape time).
_COUNTERS = [
    ("pdrelay:kvstore_lookups", "Lookup calls", "m_lookups"),
    ("pdrelay:kvstore_lookup_pages", "Pages asked about by Lookup", "m_lookup_pages"),
    ("pdrelay:kvstore_hit_pages", "Pages Lookup found (leading, any tier)", "m_hit_pages"),
    ("pdrelay:kvstore_get_pages", "Pages written into callers' memory by Get", "m_get_pages"),
    ("pdrelay:kvstore_get_failures", "Gets whose transfer failed or timed out", "m_get_failures"),
    ("pdrelay:kvstore_stored_pages", "Pages that became visible (committed puts)", "m_stored"),
    (
        "pdrelay:kvstore_evicted_pages",
        "Pages evicted from DRAM (demoted when a disk tier is on)",
        "m_evicted",
    ),
    (
        "pdrelay:kvstore_rejected_pages",
        "Put pages whose written bytes failed the caller's checksum",
        "m_rejected",
    ),
    (
        "pdrelay:kvstore_corrupt_pages",
        "Stored pages found corrupt at read (DRAM or disk) and dropped",
        "m_corrupt",
    ),
    ("pdrelay:kvstore_promoted_pages", "Pages read back from disk into DRAM on a hit", "m_promoted"),
    ("pdrelay:kvstore_t3_put_chunks", "Chunks put into the Mooncake Store", "m_t3_put_chunks"),
    ("pdrelay:kvstore_t3_put_bytes", "Bytes put into the Mooncake Store", "m_t3_put_bytes"),
    (
        "pdrelay:kvstore_t3_put_failures",
        "Mooncake Store puts refused, failed or timed out",
        "m_t3_put_failures",
    ),
    (
        "pdrelay:kvstore_t3_promoted_pages",
        "Pages promoted from the Mooncake Store into DRAM on a lookup",
        "m_t3_promoted",
    ),
    (
        "pdrelay:kvstore_t3_fetch_failures",
        "Mooncake Store gets failed or timed out",
        "m_t3_fetch_failures",
    ),
    (
        "pdrelay:kvstore_t3_dropped_pages",
        "Evicted pages the Mooncake Store did not get (down, lagging)",
        "m_t3_dropped",
    ),
    ("pdrelay:kvstore_t3_up", "1 while the Mooncake Store tier is connected and answering", "m_t3_up"),
]


class KVStoreService(Service):
    role = Role.KVSTORE

    def __init__(self, cfg: ResolvedConfig, options: ServiceOptions = ServiceOptions()) -> None:
        super().__init__(ServiceConfig.of(cfg), options)
        self.cfg = cfg
        # torch's default is every core: each page copy of a Put's eviction would wake a second OpenMP thread and
        # preempt the engines beside us (resolve_threads gives the kvstore one thread unless --threads says more)
        torch.set_num_threads(cfg.device.threads)  # >= 1 once resolved
        k = cfg.kvstore
        if k.kvstore_dram_bytes < 64 << 10:
            raise ValueError(
                f"--kvstore-dram-bytes {k.kvstore_dram_bytes} is too small for a DRAM tier; give it at "
                "least 64KiB (e.g. 1GiB): the transfer engine reads and writes pages only there"
            )
        disk = open_disk_tier(k.kvstore_disk_dir, k.kvstore_disk_bytes, k.kvstore_chunk_pages)  # ValueError: exit 2
        remote = open_remote_tier(k, cfg.transfer.transfer_host)
        self.store = PageStore(
            name=self.instance_id,
            backend=cfg.transfer.transfer_backend,
            host=cfg.transfer.transfer_host,
            dram_bytes=k.kvstore_dram_bytes,
            lease_s=k.kvstore_lease_s,
            high_watermark=k.kvstore_high_watermark,
            disk=disk,
            remote=remote,
            on_stored=self._stored,
            on_removed=self._removed,
            options=transfer_options(cfg.transfer),
        )
        self.store.on_bound(self._on_bound)
        self._kv_pub: KVEventPublisher | None = None
        self._kv_snapshots: KVSnapshotServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.telemetry.metrics.registry.register(CountersCollector(self, _COUNTERS))

    # ---- metrics (read at scrape time) ---------------------------------------------------------------------------
    def __getattr__(self, name: str) -> int:
        if not name.startswith("m_"):
            raise AttributeError(name)
        store = self.__dict__["store"]
        c, a, d = store.counters, store.arena.counters if store.arena else None, store.disk
        table = {
            "m_lookups": c.lookups,
            "m_lookup_pages": c.lookup_pages,
            "m_hit_pages": c.hit_pages,
            "m_get_pages": c.get_pages,
            "m_get_failures": c.get_failures,
            "m_promoted": c.promoted_pages,
            "m_stored": a.stored if a else 0,
            "m_evicted": a.evicted if a else 0,
            "m_rejected": a.rejected if a else 0,
            "m_corrupt": (a.corrupt if a else 0)
            + (d.counters.corrupt if d is not None else 0)
            + (store.remote.counters.corrupt if store.remote is not None else 0),
        }
        if name.startswith("m_t3_"):
            r = store.remote
            if r is None:
                return 0
            rc = r.counters
            table = {
                "m_t3_put_chunks": rc.put_chunks,
                "m_t3_put_bytes": rc.put_bytes,
                "m_t3_put_failures": rc.put_failures,
                "m_t3_promoted": c.remote_promoted_pages,
                "m_t3_fetch_failures": rc.fetch_failures,
                "m_t3_dropped": rc.dropped_pages,
                "m_t3_up": int(r.up),
            }
        return table[name]

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        worker_pb2_grpc.add_KVStoreServicer_to_server(KVStoreServicer(self), server)
        return ("pdrelay.v1.KVStore",)

    async def warm_up(self) -> None:
        assert self.bus is not None
        # what it holds, for gateways that rebuild their KV index (empty until an engine binds a namespace)
        self._kv_snapshots = KVSnapshotServer(
            self.bus, self.cluster, self.instance_id, lambda: self._kv_pub, lambda: self.epoch
        )
        await self._kv_snapshots.start()
        await asyncio.to_thread(self.store.allocate)
        self.store.start()
        if self.store.disk is not None and self.store.disk.namespace is not None:
            # the disk index survived a restart: serve its namespace at once
            model, layout = self.store.disk.namespace
            self.store.check(model, layout)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"transfer_backend": self.store.backend, "labels": {"tiers": ",".join(self._tier_names())}}
        ns = self.store.namespace
        if ns is not None:
            d["model"] = ns.model
            d["kv_layout"] = ns.layout
            a = self.store.arena
            assert a is not None
            d["capacity"] = Capacity(num_pages=a.num_slots, page_size=ns.layout.page_size)
        return d

    def _tier_names(self) -> list[str]:
        return (
            ["dram"]
            + (["disk"] if self.store.disk is not None else [])
            + (["mooncake"] if self.store.remote is not None else [])
        )

    def load_snapshot(self) -> LoadSnapshot:
        a = self.store.arena
        names = {
            worker_pb2.STORAGE_TIER_DRAM: "dram",
            worker_pb2.STORAGE_TIER_DISK: "disk",
            worker_pb2.STORAGE_TIER_PEER: "mooncake",
        }
        tiers = tuple(TierFill(names[t], used, cap, n) for t, used, cap, n in self.store.tiers())
        return LoadSnapshot(
            running=self.gate.inflight,
            free_pages=(a.num_slots - a.num_pages) if a else 0,
            total_pages=a.num_slots if a else 0,
            tiers=tiers,
            kv_seq=self._kv_pub.seq if self._kv_pub is not None else 0,
        )

    def stats_pb(self) -> worker_pb2.KVStoreStatsResponse:
        return stats_pb(self)

    async def on_epoch(self, epoch: int) -> None:
        if self._kv_pub is not None:
            self._kv_pub.set_epoch(epoch)

    async def on_stop(self) -> None:
        if self._kv_snapshots is not None:
            await self._kv_snapshots.close()
        if self._kv_pub is not None:
            await self._kv_pub.close()
        await self.store.close()

    # ---- namespace and events ------------------------------------------------------------------------------------
    def _on_bound(self, ns: Namespace) -> None:
        assert self.bus is not None
        self._kv_pub = KVEventPublisher(
            self.bus,
            self.cluster,
            self.instance_id,
            epoch=self.epoch,
            page_size=ns.layout.page_size,
            tier=STORE_TIER,
            layout_kind=ns.layout.kind,
        )
        if self.store.arena is not None and self.store.disk is not None:
            self._stored(self.store.disk.hashes())  # rebuilt from disk: tell the index
        if self.registrar is not None:
            task = asyncio.ensure_future(self.registrar.update(**self.describe()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _stored(self, hashes: Sequence[int]) -> None:
        if self._kv_pub is not None and hashes:
            self._kv_pub.stored(hashes)

    def _removed(self, hashes: Sequence[int]) -> None:
        if self._kv_pub is not None and hashes:
            self._kv_pub.evicted(hashes)

    # ---- tracing -------------------------------------------------------------------------------------------------
    def record(self, name: str, start: float, carrier: common_pb2.TraceContext, attributes: Mapping[str, Any]) -> None:
        tr = self.telemetry.tracing
        if not tr.enabled or not carrier.traceparent:
            return
        parent = extract(carrier)
        tr.record(name, start, time.monotonic(), dict(attributes), parent=parent, kind=SpanKind.SERVER)
