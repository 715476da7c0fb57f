"""KVStore gRPC servicer: validates requests, maps store errors to typed pdrelay errors, records spans."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.kvstore.store import LayoutMismatch, PageStore
from shared.cluster.grpc_errors import abort
from shared.serving.convert import BACKEND_FROM_PB, layout_from_pb, layout_to_pb
from shared.serving.handoff import descs_from_pb
from shared.telemetry import spans
from shared.transfer.checksum import crc32
from shared.transfer.errors import PeerError, RegionError, TransferError, TransferTimeout

if TYPE_CHECKING:
    from shared.modelspec.kv_layout import KVLayout

MAX_PAGES_PER_CALL = 65536  # a prompt of 1M tokens at page size 16; bounds the work of one RPC


class KVStoreHost(Protocol):
    """What the servicer reads of its service (services/kvstore/service.py), declared here so that the servicer
    does not import the service that constructs it."""

    instance_id: str
    store: PageStore

    def record(
        self, name: str, start: float, carrier: common_pb2.TraceContext, attributes: Mapping[str, Any]
    ) -> None: ...

    def stats_pb(self) -> worker_pb2.KVStoreStatsResponse: ...


class KVStoreServicer(worker_pb2_grpc.KVStoreServicer):
    def __init__(self, svc: KVStoreHost) -> None:
        self.svc = svc

    async def _layout(self, pb: common_pb2.KVLayout, n: int, context: grpc.aio.ServicerContext) -> KVLayout:
        me = self.svc.instance_id
        if n > MAX_PAGES_PER_CALL:
            await abort(
                context,
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                f"{n} block hashes in one call exceed {MAX_PAGES_PER_CALL}; split the call",
                instance_id=me,
            )
        try:
            return layout_from_pb(pb)
        except ValueError as e:
            await abort(context, common_pb2.ERROR_CODE_INVALID_ARGUMENT, f"malformed request: {e}", instance_id=me)
            raise  # unreachable: abort raises

    async def _mismatch(self, e: LayoutMismatch, context: grpc.aio.ServicerContext) -> None:
        await abort(context, common_pb2.ERROR_CODE_LAYOUT_MISMATCH, str(e), instance_id=self.svc.instance_id)

    async def Lookup(
        self, request: worker_pb2.LookupRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.LookupResponse:
        svc = self.svc
        layout = await self._layout(request.layout, len(request.block_hashes), context)
        try:
            tiers = await svc.store.lookup(request.model, layout, list(request.block_hashes), request.lease_s)
        except LayoutMismatch as e:
            await self._mismatch(e, context)
        return worker_pb2.LookupResponse(num_hit_pages=len(tiers), tiers=tiers)

    async def Put(
        self, request: worker_pb2.PutPagesRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PutPagesResponse:
        svc = self.svc
        layout = await self._layout(request.layout, len(request.block_hashes), context)
        backend = BACKEND_FROM_PB.get(request.backend)
        if backend != svc.store.backend:
            await abort(
                context,
                common_pb2.ERROR_CODE_LAYOUT_MISMATCH,
                f"caller uses transfer backend {backend or 'unspecified'!r} but this kvstore uses "
                f"{svc.store.backend!r}; run both with the same --transfer-backend",
                instance_id=svc.instance_id,
            )
        try:
            res = svc.store.reserve(request.model, layout, list(request.block_hashes))
        except LayoutMismatch as e:
            await self._mismatch(e, context)
        resp = worker_pb2.PutPagesResponse(
            pages_present=res.present, put_id=res.put_id, indexes=list(res.indexes), expires_s=svc.store.lease_s
        )
        if res.put_id:
            resp.store_peer.CopyFrom(svc.store.peer_pb())
            resp.slots.CopyFrom(svc.store.slots_pb(res.slots))
        return resp

    async def CommitPut(
        self, request: worker_pb2.CommitPutRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.CommitPutResponse:
        stored, rejected = self.svc.store.commit(request.put_id, list(request.page_checksums), request.abort)
        return worker_pb2.CommitPutResponse(pages_stored=stored, pages_rejected=rejected)

    async def Get(
        self, request: worker_pb2.GetPagesRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetPagesResponse:
        svc = self.svc
        me = svc.instance_id
        t0 = time.monotonic()
        layout = await self._layout(request.layout, len(request.block_hashes), context)
        try:
            dst = descs_from_pb(request.destination, layout)
        except ValueError as e:
            await abort(context, common_pb2.ERROR_CODE_INVALID_ARGUMENT, f"malformed Get: {e}", instance_id=me)
        if len(dst) != len(request.block_hashes):
            await abort(
                context,
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                f"Get names {len(dst)} destination pages for {len(request.block_hashes)} block hashes; "
                "send one page per hash",
                instance_id=me,
            )
        budget = request.deadline_s if request.deadline_s > 0 else svc.store.lease_s
        deadline = t0 + min(budget, svc.store.lease_s)
        try:
            read, took = await svc.store.get(
                request.model, layout, list(request.block_hashes), request.destination_peer, dst, deadline
            )
        except LayoutMismatch as e:
            await self._mismatch(e, context)
        except TransferTimeout as e:
            await abort(context, common_pb2.ERROR_CODE_TIMEOUT, str(e), instance_id=me)
        except (PeerError, RegionError) as e:
            await abort(context, common_pb2.ERROR_CODE_INVALID_ARGUMENT, f"bad destination: {e}", instance_id=me)
        except TransferError as e:
            await abort(context, common_pb2.ERROR_CODE_TRANSFER_FAILED, str(e), instance_id=me)
        crc = 0
        for c in read.crcs:
            crc = crc32(c.to_bytes(4, "little"), crc)
        nbytes = len(read.hashes) * layout.page_bytes
        svc.record(
            spans.KVSTORE_GET,
            t0,
            request.trace,
            {
                spans.PAGES: len(read.hashes),
                spans.TRANSFER_BYTES: nbytes,
                spans.TRANSFER_BACKEND: svc.store.backend,
                spans.KVSTORE_CORRUPT_PAGES: read.corrupt,
            },
        )
        return worker_pb2.GetPagesResponse(
            pages_written=len(read.hashes),
            page_checksums=list(read.crcs),
            checksum_algorithm=worker_pb2.CHECKSUM_ALGORITHM_CRC32,
            checksum=crc,
            transfer_s=took,
            pages_corrupt=read.corrupt,
        )

    async def Stats(
        self, request: worker_pb2.KVStoreStatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.KVStoreStatsResponse:
        return self.svc.stats_pb()


def stats_pb(svc: KVStoreHost) -> worker_pb2.KVStoreStatsResponse:
    store = svc.store
    c = store.counters
    a = store.arena.counters if store.arena is not None else None
    resp = worker_pb2.KVStoreStatsResponse(
        lookups=c.lookups,
        hit_pages=c.hit_pages,
        get_pages=c.get_pages,
        stored_pages=a.stored if a else 0,
        evicted_pages=a.evicted if a else 0,
        corrupt_pages=(a.corrupt if a else 0) + (store.disk.counters.corrupt if store.disk is not None else 0),
    )
    for tier, used, cap, pages in store.tiers():
        resp.tiers.append(worker_pb2.TierStats(tier=tier, used_bytes=used, capacity_bytes=cap, pages=pages))
    if store.namespace is not None:
        resp.model = store.namespace.model
        resp.layout.CopyFrom(layout_to_pb(store.namespace.layout))
    return resp
