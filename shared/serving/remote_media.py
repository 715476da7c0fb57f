"""Prefill's side of encode-prefill-decode: image embeddings from the encoder the gateway picked, written by the
encoder straight into an arena of prefill's registered memory (NIXL / Mooncake, like KV pages); the Encode RPC
carries the arena regions and comes back with shapes and CRC-32s, which are checked before use.

Any failure (encoder gone, hung past the deadline, refused, wrong checksum, arena full) falls back to prefill's own
tower: an encoder can make a request faster, never fail it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
import torch

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from shared.cluster.tls import TlsFiles, open_channel
from shared.engine.request import MediaInput
from shared.serving.kv_transfer import KVTransfer
from shared.serving.media import LocalVision
from shared.telemetry import spans
from shared.telemetry.tracing import SpanKind, Tracing, inject, set_error
from shared.transfer.checksum import crc32

log = logging.getLogger(__name__)


class EmbeddingArena:
    """Fixed-size slots (one image's embeddings each) in one registered buffer."""

    def __init__(self, transfer: KVTransfer, slot_bytes: int, num_slots: int) -> None:
        self.slot_bytes = slot_bytes
        self.buffer = torch.zeros(slot_bytes * num_slots, dtype=torch.uint8)
        self.region = transfer.register_extra(self.buffer)
        self.free = list(range(num_slots))

    def take(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        got, self.free = self.free[:n], self.free[n:]
        return got

    def give_back(self, slots: Sequence[int]) -> None:
        self.free.extend(slots)

    def address(self, slot: int) -> int:
        return self.region.addr + slot * self.slot_bytes


class RemoteVision:
    def __init__(
        self,
        transfer: KVTransfer,
        local: LocalVision,
        *,
        num_slots: int = 16,
        timeout_s: float = 30.0,
        tracing: Tracing | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        r = local.runner
        self.tls = tls  # the cluster's mutual TLS on the channels to encoders
        self.transfer = transfer
        self.local = local
        self.hidden = r.hidden_size
        self.num_tokens = r.num_image_tokens
        self.dtype = r.dtype
        elem = torch.empty((), dtype=r.dtype).element_size()
        self.arena = EmbeddingArena(transfer, self.num_tokens * self.hidden * elem, num_slots)
        self.timeout_s = timeout_s
        self.tracing = tracing
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.remote_items = 0
        self.fallbacks = 0

    async def embed(
        self, request_id: str, media: Sequence[common_pb2.MediaInput], *, budget_s: float | None = None
    ) -> list[MediaInput]:
        """Engine MediaInputs for every item: from the encoders named in `media`, else (or on failure) local. An
        encoder call may take `budget_s` (at most the configured timeout; at least 50 ms)."""
        timeout_s = self.timeout_s if budget_s is None else max(0.05, min(self.timeout_s, budget_s))
        out: dict[int, MediaInput] = {}
        by_encoder: dict[str, list[int]] = {}
        for i, m in enumerate(media):
            if m.HasField("encoder") and m.encoder.grpc_address:
                by_encoder.setdefault(m.encoder.grpc_address, []).append(i)
        for address, idx in by_encoder.items():
            got = await self._remote(request_id, address, [media[i] for i in idx], timeout_s)
            if got is not None:
                out.update(zip(idx, got))
        rest = [i for i in range(len(media)) if i not in out]
        if rest:
            self.fallbacks += sum(1 for i in rest if media[i].HasField("encoder"))
            local = await self.local.embed([media[i] for i in rest])
            out.update(zip(rest, local))
        return [out[i] for i in range(len(media))]

    async def _remote(
        self, request_id: str, address: str, items: list[common_pb2.MediaInput], timeout_s: float
    ) -> list[MediaInput] | None:
        if any(m.num_tokens != self.num_tokens for m in items):
            return None  # the local path raises the precise error
        slots = self.arena.take(len(items))
        if slots is None:
            return None
        tr = self.tracing
        span = (
            tr.start_span(
                spans.PREFILL_ENCODE,
                kind=SpanKind.CLIENT,
                attributes={
                    spans.SERVER_ADDRESS: address,
                    spans.RPC_SYSTEM: "grpc",
                    spans.RPC_METHOD: "pdrelay.v1.Encoder/Encode",
                    "pdrelay.encoder.items": len(items),
                },
            )
            if tr is not None
            else None
        )
        try:
            req = worker_pb2.EncodeRequest(request_id=request_id, media=items, destination_peer=self.transfer.peer_pb())
            if span is not None:
                inject(span, req.trace)  # the encoder's span is a child of this call
            req.destination.memory_kind = common_pb2.MEMORY_KIND_DRAM
            req.destination.regions.addresses.extend(self.arena.address(s) for s in slots)
            req.destination.regions.lengths.extend([self.arena.slot_bytes] * len(slots))
            self.transfer.begin_receive()
            try:
                resp = await self._stub(address).Encode(req, timeout=timeout_s)
            finally:
                self.transfer.end_receive()
            if len(resp.embeddings) != len(items):
                raise ValueError(f"{len(resp.embeddings)} embeddings for {len(items)} items")
            out = []
            for m, e, s in zip(items, resp.embeddings, slots, strict=True):
                raw = self.arena.buffer[s * self.arena.slot_bytes : (s + 1) * self.arena.slot_bytes]
                if crc32(raw.numpy().data) != e.checksum:
                    raise ValueError(f"embedding of {m.media_hash} arrived with a wrong checksum")
                # a copy: the slot is reused by the next request
                emb = raw.clone().view(self.dtype).view(self.num_tokens, self.hidden)
                out.append(MediaInput(m.token_offset, m.num_tokens, m.media_hash, emb))
            self.remote_items += len(items)
            if span is not None:
                span.set_attribute("pdrelay.encoder.cache_hits", sum(1 for e in resp.embeddings if e.cache_hit))
            return out
        except (grpc.aio.AioRpcError, ValueError) as e:
            detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
            log.warning("encoder %s failed for %s (%s); encoding here instead", address, request_id, detail)
            if span is not None:
                set_error(span, detail or type(e).__name__)
            return None
        finally:
            self.arena.give_back(slots)
            if span is not None:
                Tracing.end(span)

    def _stub(self, address: str) -> worker_pb2_grpc.EncoderStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, self.tls)
        return worker_pb2_grpc.EncoderStub(ch)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
