"""bf16 KV pages through the store's tiers: the bytes a bf16 pool holds come back byte for byte from the DRAM arena
and the disk tier, and a bf16 layout is a namespace of its own (its pages never serve an fp32 pool)."""

from __future__ import annotations

from pathlib import Path

import torch

from services.kvstore.arena import DramArena, page_crc
from services.kvstore.disk import open_disk_tier
from shared.engine.kv_pool import KVPool
from shared.modelspec.kv_layout import KVLayout

BF16 = KVLayout(dtype="bfloat16", page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
FP32 = KVLayout(dtype="float32", page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)


def _pool() -> KVPool:
    """A bf16 pool whose pages hold values a bf16 cache really holds (rounded from fp32, every bit pattern used)."""
    pool = KVPool(BF16, 6)
    g = torch.Generator().manual_seed(0)
    pool.buffer.copy_(torch.randn(pool.buffer.shape, generator=g).to(torch.bfloat16))
    return pool


def test_bf16_pages_round_trip_the_arena_and_the_disk_tier_byte_for_byte(tmp_path: Path) -> None:
    pool = _pool()
    pb = BF16.page_bytes
    assert pb * 2 == FP32.page_bytes  # half the bytes of the same fp32 layout
    arena = DramArena(8 * pb, pb)
    res = arena.reserve([11, 12, 13])
    crcs = []
    for slot, page in zip(res.slots, (1, 3, 5), strict=True):
        arena.slot_view(slot).copy_(pool.pages_bytes([page]))  # what a transfer into the store does: bytes
        crcs.append(page_crc(arena.slot_view(slot)))
    assert arena.commit(res.put_id, crcs) == ([11, 12, 13], 0)
    read = arena.begin_read([11, 12, 13])
    back = KVPool(BF16, 6)
    for slot, page in zip(read.slots, (0, 2, 4), strict=True):
        back.page_view(page).view(-1).view(torch.uint8).copy_(arena.slot_view(slot))
    arena.end_read(read)
    for src, dst in ((1, 0), (3, 2), (5, 4)):
        assert torch.equal(back.page_view(dst).view(torch.int16), pool.page_view(src).view(torch.int16))
    assert back.pages_checksum([0, 2, 4]) == pool.pages_checksum([1, 3, 5])

    disk = open_disk_tier(str(tmp_path), 1 << 20, 2)
    assert disk is not None
    disk.bind("m", BF16)
    for h, page in ((21, 1), (22, 3), (23, 5)):
        data = pool.pages_bytes([page])
        disk.demote(h, data, page_crc(data))
    for th in disk._threads:
        th.join(5)
    got = dict(disk.read_pages([21, 22, 23]))
    for h, page in ((21, 1), (22, 3), (23, 5)):
        assert torch.equal(got[h], pool.pages_bytes([page]))
    disk.close()


def test_a_bf16_layout_is_its_own_namespace() -> None:
    assert not BF16.compatible_with(FP32) and BF16 != FP32
