"""KV events say which KVLayout kind their pages are: an "mla" publisher's batches carry layout_kind, an "mha"
one's are encoded exactly as before the field existed (msgpack bytes without it), and old events read as mha."""

from __future__ import annotations

import asyncio

import msgspec

from shared.cluster.bus.kv_events import KVEventBatch, KVEventPublisher, KVOp, KVOpKind


class _Wire:
    """A bus that keeps what is published, encoded as the real one encodes it (msgpack)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def publish(self, subject: str, msg: msgspec.Struct) -> bool:
        self.sent.append(msgspec.msgpack.encode(msg))
        return True


class _OldBatch(msgspec.Struct, frozen=True, kw_only=True):
    """KVEventBatch as it was before layout_kind."""

    instance_id: str
    epoch: int
    seq: int
    ops: tuple[KVOp, ...]
    page_size: int
    tier: str = "device"
    ts: float = 0.0


async def _publish(kind: str) -> bytes:
    wire = _Wire()
    pub = KVEventPublisher(wire, "c", "p-1", epoch=2, page_size=16, layout_kind=kind)  # type: ignore[arg-type]
    pub.stored([1, 2])
    await pub.flush()
    assert len(wire.sent) == 1
    return wire.sent[0]


def test_mla_events_carry_the_kind_and_mha_events_keep_their_bytes() -> None:
    mla = msgspec.msgpack.decode(asyncio.run(_publish("mla")), type=KVEventBatch)
    assert mla.kind == "mla" and mla.ops == (KVOp(KVOpKind.STORED, (1, 2)),)
    raw = asyncio.run(_publish("mha"))
    mha = msgspec.msgpack.decode(raw, type=KVEventBatch)
    assert mha.kind == "mha" and b"layout_kind" not in raw
    old = _OldBatch(instance_id="p-1", epoch=2, seq=1, ops=mha.ops, page_size=16, ts=mha.ts)
    assert msgspec.msgpack.encode(old) == raw
    # an older publisher's batch reads as mha
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=KVEventBatch).kind == "mha"
