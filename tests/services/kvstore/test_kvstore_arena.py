"""The DRAM arena alone: two-phase visibility, leases against eviction, LRU, corruption, bounded bookkeeping."""

from __future__ import annotations

import torch

from services.kvstore.arena import DramArena, page_crc

PB = 256  # bytes per page


def _put(arena: DramArena, hashes: list[int], fill: int = 7) -> list[int]:
    """Phase 1 + write + phase 2, as a caller would (the write is a local copy here)."""
    res = arena.reserve(hashes)
    crcs = []
    for i, slot in zip(res.indexes, res.slots, strict=True):
        arena.slot_view(slot).fill_((fill + hashes[i]) % 251)
        crcs.append(page_crc(arena.slot_view(slot)))
    stored, rejected = arena.commit(res.put_id, crcs)
    assert rejected == 0
    return stored


def test_pages_are_invisible_until_committed_and_checked() -> None:
    arena = DramArena(8 * PB, PB)
    res = arena.reserve([1, 2, 3])
    assert res.present == 0 and len(res.slots) == 3
    assert arena.lookup([1, 2, 3]) == 0  # reserved, not visible
    assert arena.reserve([1, 2]).put_id == 0  # being put by someone else: not handed out twice
    for slot in res.slots:
        arena.slot_view(slot).fill_(5)
    good = page_crc(arena.slot_view(res.slots[0]))
    stored, rejected = arena.commit(res.put_id, [good, good, good ^ 1])  # the last page arrived damaged
    assert stored == [1, 2] and rejected == 1
    assert arena.lookup([1, 2, 3]) == 2 and arena.num_pages == 2
    assert arena.counters.rejected == 1
    # present pages are skipped at the next put; only the missing one gets a slot
    again = arena.reserve([1, 2, 3])
    assert again.present == 2 and again.indexes == (2,)
    arena.abort(again.put_id)
    assert arena.used_bytes == 2 * PB


def test_lru_eviction_skips_leased_and_read_pages() -> None:
    arena = DramArena(4 * PB, PB, lease_s=5.0)
    assert _put(arena, [1, 2, 3, 4]) == [1, 2, 3, 4]
    assert arena.lookup([1], lease_s=5.0, now=0.0) == 1  # 1 leased (and most recent)
    read = arena.begin_read([2])  # 2 being read
    assert read.hashes == (2,)
    assert _put(arena, [5, 6]) == [5, 6]  # evicts the two least recently used free pages: 3 and 4
    assert 3 not in arena and 4 not in arena and 1 in arena and 2 in arena
    assert sorted(arena.take_removed()) == [3, 4]
    # everything left is leased, read or newer; once the read ends and the lease lapses, they go in LRU order
    arena.end_read(read)
    assert arena.evict(1, now=10.0) == [1]


def test_full_arena_gives_a_shorter_reservation_instead_of_failing() -> None:
    arena = DramArena(2 * PB, PB)
    _put(arena, [1, 2])
    r1 = arena.begin_read([1, 2])
    res = arena.reserve([7, 8])
    assert res.put_id == 0 and arena.counters.full == 2  # nothing evictable: nothing reserved
    arena.end_read(r1)


def test_corrupt_page_is_dropped_at_read() -> None:
    arena = DramArena(4 * PB, PB)
    _put(arena, [1, 2, 3])
    entry = dict(arena.entries())[2]
    arena.slot_view(entry.slot)[17] ^= 0xFF  # a bit flip in DRAM
    read = arena.begin_read([1, 2, 3])
    assert read.hashes == (1,) and read.corrupt == 1  # stops at the corrupt page: a prefix is all a Get serves
    assert 2 not in arena and arena.counters.corrupt == 1
    arena.end_read(read)
    assert arena.lookup([1, 2, 3]) == 1


def test_a_page_dropped_while_read_frees_its_slot_when_the_read_ends() -> None:
    arena = DramArena(2 * PB, PB)
    _put(arena, [1])
    read = arena.begin_read([1])
    assert arena.drop(1)
    used = arena.used_bytes
    arena.end_read(read)
    assert arena.used_bytes == used - PB


def test_abandoned_puts_expire_and_indexes_stay_bounded() -> None:
    arena = DramArena(16 * PB, PB, lease_s=1.0)
    for i in range(100):  # writers that reserve and vanish
        arena.reserve([1000 + i], now=float(i))
    assert arena.counters.expired_puts >= 98
    assert arena.used_bytes <= 2 * PB
    assert arena.pending_puts <= 2  # what keeps the store's transfer progress fast: never the vanished writers
    arena.expire(now=1000.0)
    assert arena.pending_puts == 0
    for i in range(0, 400, 4):  # far more pages than slots
        _put(arena, [i, i + 1, i + 2, i + 3])
    assert arena.num_pages <= arena.num_slots and len(arena.entries()) == arena.num_pages


def test_arena_carves_slots_from_a_given_buffer() -> None:
    buf = torch.zeros(10 * PB + 3, dtype=torch.uint8)
    arena = DramArena(buf.numel(), PB, buffer=buf)
    assert arena.num_slots == 10 and arena.slot_view(3).data_ptr() == buf.data_ptr() + 3 * PB
