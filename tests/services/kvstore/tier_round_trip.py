"""One check for every KV dtype: pages of a pool go through the store's DRAM arena and disk tier and come back byte for
byte (what a transfer into and out of the store does with them: bytes, whatever the dtype)."""

from __future__ import annotations

from pathlib import Path

import torch

from services.kvstore.arena import DramArena, page_crc
from services.kvstore.disk import open_disk_tier
from shared.engine.kv_pool import KVPool


def _bytes(pool: KVPool, page: int) -> torch.Tensor:
    return pool.page_view(page).reshape(-1).view(torch.uint8)


def assert_pages_round_trip(pool: KVPool, tmp_path: Path) -> None:
    """Pages 1, 3, 5 of `pool` (6 pages) -> the arena -> pages 0, 2, 4 of a fresh pool, and -> the disk tier -> back:
    equal bytes and equal checksums."""
    layout, pb = pool.layout, pool.layout.page_bytes
    arena = DramArena(8 * pb, pb)
    res = arena.reserve([11, 12, 13])
    crcs = []
    for slot, page in zip(res.slots, (1, 3, 5), strict=True):
        arena.slot_view(slot).copy_(pool.pages_bytes([page]))
        crcs.append(page_crc(arena.slot_view(slot)))
    assert arena.commit(res.put_id, crcs) == ([11, 12, 13], 0)
    read = arena.begin_read([11, 12, 13])
    back = KVPool(layout, 6)
    for slot, page in zip(read.slots, (0, 2, 4), strict=True):
        _bytes(back, page).copy_(arena.slot_view(slot))
    arena.end_read(read)
    for src, dst in ((1, 0), (3, 2), (5, 4)):
        assert torch.equal(_bytes(back, dst), _bytes(pool, src))
    assert back.pages_checksum([0, 2, 4]) == pool.pages_checksum([1, 3, 5])

    disk = open_disk_tier(str(tmp_path), 1 << 20, 2)
    assert disk is not None
    disk.bind("m", layout)
    for h, page in ((21, 1), (22, 3), (23, 5)):
        data = pool.pages_bytes([page])
        disk.demote(h, data, page_crc(data))
    for th in disk._threads:
        th.join(5)
    got = dict(disk.read_pages([21, 22, 23]))
    for h, page in ((21, 1), (22, 3), (23, 5)):
        assert torch.equal(got[h], pool.pages_bytes([page]))
    disk.close()
