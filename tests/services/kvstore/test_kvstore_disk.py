"""The disk tier alone: demotion into checksummed chunk files, reads, the byte budget, rebuild on restart, corrupt
chunks and pages, and directories it cannot use."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from services.kvstore.arena import DramArena, page_crc
from services.kvstore.disk import DiskTier, open_disk_tier
from shared.modelspec.kv_layout import KVLayout

LAYOUT = KVLayout(dtype="float32", page_size=4, num_layers=1, num_kv_heads=1, head_dim=8)  # 256-byte pages
PB = LAYOUT.page_bytes


def _page(h: int) -> torch.Tensor:
    return torch.full((PB,), h % 251, dtype=torch.uint8)


def _tier(d: Path, capacity: int = 1 << 20, chunk: int = 4) -> DiskTier:
    t = open_disk_tier(str(d), capacity, chunk)
    assert t is not None
    t.bind("m", LAYOUT)
    return t


def _demote(t: DiskTier, hashes: range) -> None:
    for h in hashes:
        p = _page(h)
        t.demote(h, p, page_crc(p))


def _settle(t: DiskTier) -> None:
    for th in t._threads:
        th.join(5)


def test_demoted_pages_are_read_back_verified_and_survive_a_restart(tmp_path: Path) -> None:
    t = _tier(tmp_path)
    _demote(t, range(1, 11))  # 10 pages: 2 full chunks written, 2 staged
    _settle(t)
    assert t.lookup(list(range(1, 11))) == 10 and t.num_pages == 10
    got = t.read_pages([1, 2, 3, 9])
    assert [h for h, _ in got] == [1, 2, 3, 9] and all(torch.equal(d, _page(h)) for h, d in got)
    t.close()  # writes the partial chunk
    assert len(list(tmp_path.glob("chunk-*.kv"))) == 3
    again = DiskTier(tmp_path, 1 << 20, 4)
    assert again.namespace == ("m", LAYOUT) and again.num_pages == 10
    assert [h for h, _ in again.read_pages(list(range(1, 11)))] == list(range(1, 11))
    again.forget([1, 2, 3, 4])  # promoted: the first chunk has no live page left and goes
    assert len(list(tmp_path.glob("chunk-*.kv"))) == 2 and 1 not in again


def test_corrupt_pages_and_chunks_are_dropped(tmp_path: Path) -> None:
    t = _tier(tmp_path)
    _demote(t, range(1, 9))
    _settle(t)
    t.close()
    first, second = sorted(tmp_path.glob("chunk-*.kv"), key=lambda p: int(p.stem.split("-")[1]))
    data = bytearray(second.read_bytes())
    data[-PB + 5] ^= 0xFF  # a flipped bit in the last page of the second chunk
    second.write_bytes(bytes(data))
    head = bytearray(first.read_bytes())
    head[8] ^= 0xFF  # a damaged header: the whole chunk is dropped at start
    first.write_bytes(bytes(head))
    t2 = DiskTier(tmp_path, 1 << 20, 4)
    assert t2.counters.corrupt == 1 and not first.exists() and t2.lookup([1]) == 0
    got = t2.read_pages([5, 6, 7, 8])
    assert [h for h, _ in got] == [5, 6, 7]  # page 8 failed its CRC: dropped, the read ends there
    assert t2.counters.corrupt == 2 and 8 not in t2 and 8 in t2.take_removed()


def test_byte_budget_drops_the_oldest_chunks(tmp_path: Path) -> None:
    t = _tier(tmp_path, capacity=3 * 4 * PB, chunk=4)  # room for ~2 chunks with their headers
    _demote(t, range(1, 17))
    t.close()
    assert t.counters.dropped_chunks >= 2 and t.used_bytes <= t.capacity_bytes
    assert 1 not in t and 16 in t and {1, 2, 3, 4} <= set(t.take_removed())


def test_arena_eviction_demotes_through_the_hook(tmp_path: Path) -> None:
    t = _tier(tmp_path, chunk=2)
    arena = DramArena(4 * PB, PB, evict_hook=t.demote)
    for h in range(1, 9):
        res = arena.reserve([h])
        arena.slot_view(res.slots[0]).copy_(_page(h))
        arena.commit(res.put_id, [page_crc(_page(h))])
    _settle(t)
    assert arena.num_pages == 4 and t.lookup([1, 2, 3, 4]) == 4  # the four oldest went down a tier
    assert torch.equal(dict(t.read_pages([3]))[3], _page(3))


def test_unusable_directory_is_a_clear_error_and_a_write_error_stops_demotion(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"^--kvstore-disk-dir .*file/sub is not a writable directory"):
        open_disk_tier(str(blocker / "sub"), 1 << 20, 4)
    assert open_disk_tier(None, 1 << 20, 4) is None
    d = tmp_path / "gone"
    t = _tier(d, chunk=2)
    for p in d.iterdir():
        p.unlink()
    d.rmdir()  # the disk went away under the store
    _demote(t, range(1, 3))
    _settle(t)
    time.sleep(0.05)
    assert t.counters.write_errors == 1 and t._stopped
    _demote(t, range(3, 5))  # ignored from now on: no crash, no growth
    assert t.num_pages == 0
