"""The encoder's VisionEncoder: a LLaVA checkpoint's tower + projector behind Encode, with an encoder cache (LRU by
media hash, item and byte budgets; a hit skips the tower), writing the embeddings straight into the caller's
registered memory through its transfer backend (NIXL / Mooncake): the RPC carries descriptors, never the tensors.

Per request: validate every item (span size, pixel bytes), look the hashes up, run the tower once over the misses
(in a thread), copy the embeddings into a registered staging buffer, write each one to its destination region,
wait for the writes, answer shape + CRC-32 per item. A transfer engine per backend is created on first use (the
caller's TransferPeer says which), so the encoder needs no transfer configuration of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import torch

from proto.pdrelay.v1 import common_pb2, worker_pb2
from services.encoder.errors import EncoderError
from shared.engine.encoder_cache import EncoderCache
from shared.engine.errors import InvalidRequest
from shared.engine.vision_runner import VisionEncoderRunner
from shared.serving.convert import BACKEND_FROM_PB
from shared.serving.media import LocalVision
from shared.transfer import create_engine
from shared.transfer.base import TransferEngine
from shared.transfer.checksum import crc32
from shared.transfer.descs import PageDesc, RegionHandle
from shared.transfer.errors import TransferError

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 10.0


class _Writer:
    """One transfer engine (of one backend) with a registered staging buffer the embeddings are copied into."""

    def __init__(self, engine: TransferEngine, staging_bytes: int) -> None:
        self.engine = engine
        self.staging = torch.empty(staging_bytes, dtype=torch.uint8)
        self.region: RegionHandle = engine.register(self.staging)
        self.peers: dict[bytes, str] = {}

    def peer(self, peer: common_pb2.TransferPeer) -> str:
        key = peer.agent_metadata or peer.endpoint.encode()
        name = self.peers.get(key)
        if name is None:
            name = self.peers[key] = self.engine.connect(peer.agent_metadata)
        return name


class TowerEncoder:
    """VisionEncoder (services/encoder/vision.py) over a VisionEncoderRunner."""

    def __init__(
        self,
        model: str,
        runner: VisionEncoderRunner,
        cache: EncoderCache,
        *,
        name: str,
        host: str,
        staging_bytes: int = 64 << 20,
    ) -> None:
        self.model = model
        self.local = LocalVision(runner, cache)
        self.name = name
        self.host = host
        self.staging_bytes = staging_bytes
        self._writers: dict[str, _Writer] = {}
        self._lock = asyncio.Lock()  # one request's staging copy + writes at a time

    @property
    def cache(self) -> EncoderCache:
        return self.local.cache

    async def encode(self, request: worker_pb2.EncodeRequest) -> worker_pb2.EncodeResponse:
        if not request.media:
            raise EncoderError(common_pb2.ERROR_CODE_INVALID_ARGUMENT, "EncodeRequest has no media")
        cached = [m.media_hash in self.cache for m in request.media]
        try:
            items = await self.local.embed(request.media)
        except InvalidRequest as e:
            raise EncoderError(common_pb2.ERROR_CODE_INVALID_ARGUMENT, str(e)) from None
        embeds = [it.embeds for it in items]
        assert all(e is not None for e in embeds)
        resp = worker_pb2.EncodeResponse()
        remote = request.HasField("destination_peer")
        blobs = [e.contiguous().view(torch.uint8).reshape(-1) for e in embeds]  # type: ignore[union-attr]  # none is None (asserted)
        if remote:
            await self._write(request, blobs)
        for m, emb, b, hit in zip(request.media, embeds, blobs, cached, strict=True):
            assert emb is not None
            t = worker_pb2.Tensor(
                dtype=_DTYPES[emb.dtype], shape=list(emb.shape), data=b"" if remote else b.numpy().tobytes()
            )
            resp.embeddings.append(
                worker_pb2.MediaEmbedding(
                    media_hash=m.media_hash, embedding=t, cache_hit=hit, checksum=crc32(b.numpy().data)
                )
            )
        return resp

    async def _write(self, request: worker_pb2.EncodeRequest, blobs: list[torch.Tensor]) -> None:
        backend = BACKEND_FROM_PB.get(request.destination_peer.backend)
        if backend is None:
            raise EncoderError(common_pb2.ERROR_CODE_INVALID_ARGUMENT, "destination_peer names no transfer backend")
        regions = request.destination.regions
        if request.destination.WhichOneof("layout") != "regions" or len(regions.addresses) != len(blobs):
            raise EncoderError(
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                f"destination must list one region per media item ({len(blobs)})",
            )
        for i, (n, b) in enumerate(zip(regions.lengths, blobs, strict=True)):
            if n != b.numel():
                raise EncoderError(
                    common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                    f"destination region {i} is {n} bytes but the embedding is {b.numel()}",
                )
        total = sum(b.numel() for b in blobs)
        if total > self.staging_bytes:
            raise EncoderError(
                common_pb2.ERROR_CODE_OVERLOADED,
                f"{total} bytes of embeddings exceed the {self.staging_bytes}-byte staging buffer",
            )
        async with self._lock:
            try:
                w = await self._writer(backend)
                peer = w.peer(request.destination_peer)
                off = 0
                for b in blobs:  # into registered memory: the backends move bytes between registered regions only
                    w.staging[off : off + b.numel()].copy_(b)
                    off += b.numel()
                src, o = [], 0
                for b in blobs:
                    src.extend(w.engine.describe(w.region, [(o, b.numel())]))
                    o += b.numel()
                dst = [PageDesc(a, n) for a, n in zip(regions.addresses, regions.lengths, strict=True)]
                handle = w.engine.write(peer, src, dst, f"{request.request_id}:enc".encode())
                deadline = time.monotonic() + WRITE_TIMEOUT_S
                while (status := w.engine.poll(handle)) == "pending":
                    if time.monotonic() > deadline:
                        raise TransferError(f"embedding write not done after {WRITE_TIMEOUT_S} s")
                    await asyncio.sleep(0.0005)
                if status != "done":
                    raise TransferError("embedding write failed")
            except TransferError as e:
                raise EncoderError(common_pb2.ERROR_CODE_TRANSFER_FAILED, f"writing embeddings: {e}") from None

    def prewarm(self, backend: str = "nixl") -> None:
        """Create the transfer engine of `backend` now (seconds for NIXL), not on the first request; a backend that
        cannot load here is left for the first request to report."""
        if backend not in self._writers:
            try:
                self._writers[backend] = _Writer(
                    create_engine(backend, name=f"{self.name}-enc", host=self.host), self.staging_bytes
                )
            except Exception as e:  # BackendUnavailable, a UCX error: not fatal for an encoder  # noqa: BLE001
                log.warning("transfer backend %s not ready at start-up (%s); trying again on first use", backend, e)

    async def _writer(self, backend: str) -> _Writer:
        w = self._writers.get(backend)
        if w is None:
            engine = await asyncio.to_thread(create_engine, backend, name=f"{self.name}-enc", host=self.host)
            w = self._writers[backend] = _Writer(engine, self.staging_bytes)
        return w

    async def close(self) -> None:
        for w in self._writers.values():
            try:
                w.engine.close()
            except TransferError:
                pass
        self._writers.clear()


_DTYPES: dict[Any, common_pb2.DType] = {
    torch.float32: common_pb2.DTYPE_FLOAT32,
    torch.bfloat16: common_pb2.DTYPE_BFLOAT16,
    torch.float16: common_pb2.DTYPE_FLOAT16,
}
