"""T1 of the store: a host DRAM arena of fixed-size page slots, an LRU index over them, two-phase puts and leases.

    arena = DramArena(capacity_bytes, page_bytes, lease_s=10)
    put = arena.reserve(hashes)                # slots for the pages not held yet; invisible until committed
    ...the caller writes its pages into put.slots over the transfer engine...
    arena.commit(put.put_id, crcs)             # each slot checked against the caller's CRC-32: visible, or dropped
    hits = arena.lookup(hashes, lease_s=2)     # leading pages held; leased against eviction for 2 s
    reads = arena.begin_read(hashes)           # leading pages, each verified against its CRC (corrupt ones dropped)
    ...the store writes the slots into the caller's memory...
    arena.end_read(reads)

Every index is bounded: entries by the number of slots, pending puts by the slots they reserve (and they expire
after lease_s), so nothing grows with traffic. Eviction takes the least recently used committed page that no
read holds and whose lookup lease has expired; `evict_hook` sees each victim before its slot is reused (demotion
to disk). Not thread-safe: the store calls it from its event loop only.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from shared.engine.hostmem import alloc_host_buffer
from shared.transfer.checksum import crc32


@dataclass
class Entry:
    slot: int
    crc: int  # CRC-32 of the page bytes, as committed
    readers: int = 0  # Gets writing from this slot right now
    lease_until: float = 0.0  # monotonic; a lookup lease blocks eviction until then


@dataclass(frozen=True)
class Reservation:
    """Slots of one phase-1 put: block_hashes[indexes[i]] goes into slots[i]. put_id 0: nothing to write."""

    put_id: int
    indexes: tuple[int, ...]
    slots: tuple[int, ...]
    present: int  # pages already held (skipped)


@dataclass
class _Pending:
    hashes: tuple[int, ...]
    slots: tuple[int, ...]
    expires: float


@dataclass(frozen=True)
class Read:
    """Pages a Get writes out, verified: hashes[i] sits in slots[i] with CRC-32 crcs[i]."""

    hashes: tuple[int, ...]
    slots: tuple[int, ...]
    crcs: tuple[int, ...]
    corrupt: int  # pages that failed their check (dropped); the read stops at the first one


@dataclass
class ArenaCounters:
    stored: int = 0
    evicted: int = 0
    rejected: int = 0  # commits whose CRC did not match what the caller wrote
    corrupt: int = 0  # committed pages whose bytes no longer match their CRC (found at read)
    expired_puts: int = 0
    full: int = 0  # pages a put could not get a slot for


def page_crc(buf: torch.Tensor) -> int:
    """CRC-32 of one page's bytes (a contiguous uint8 CPU tensor); zlib-ng, see shared/transfer/checksum.py."""
    return crc32(buf.numpy().data)


class DramArena:
    def __init__(
        self,
        capacity_bytes: int,
        page_bytes: int,
        *,
        lease_s: float = 10.0,
        evict_hook: Callable[[int, torch.Tensor, int], None] | None = None,
        buffer: torch.Tensor | None = None,
    ) -> None:
        """buffer: a flat uint8 host buffer of capacity_bytes to carve the slots from (the store allocates and
        registers it with the transfer engine at start, before any layout is known); None: allocate one."""
        if page_bytes <= 0:
            raise ValueError(f"page_bytes must be > 0 (got {page_bytes})")
        num_slots = capacity_bytes // page_bytes
        if num_slots < 1:
            raise ValueError(
                f"--kvstore-dram-bytes {capacity_bytes} holds no page of {page_bytes} bytes; give the "
                f"DRAM tier at least {page_bytes} bytes (e.g. 1GiB)"
            )
        self.page_bytes = page_bytes
        self.num_slots = num_slots
        self.lease_s = lease_s
        self.evict_hook = evict_hook
        if buffer is None:
            buffer = alloc_host_buffer([num_slots * page_bytes], torch.uint8)
        assert buffer.numel() >= num_slots * page_bytes and buffer.dtype == torch.uint8
        self.buffer = buffer[: num_slots * page_bytes].view(num_slots, page_bytes)  # [slots, page_bytes]
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._index: OrderedDict[int, Entry] = OrderedDict()  # hash -> entry, least recently used first
        self._pending: dict[int, _Pending] = {}
        self._put_ids = itertools.count(1)
        self._orphans: dict[int, int] = {}  # slot -> reads still writing from a dropped page's slot
        self._removed: list[int] = []  # hashes that left the arena since take_removed()
        self.counters = ArenaCounters()

    # ---- queries -------------------------------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        return (self.num_slots - len(self._free)) * self.page_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.num_slots * self.page_bytes

    def __contains__(self, h: int) -> bool:
        return h in self._index

    def slot_view(self, slot: int) -> torch.Tensor:
        return self.buffer[slot]

    def lookup(self, hashes: Sequence[int], lease_s: float = 0.0, now: float | None = None) -> int:
        """Leading pages held; with lease_s > 0 (capped at the arena's lease) they are kept that long."""
        now = time.monotonic() if now is None else now
        until = now + min(lease_s, self.lease_s)
        n = 0
        for h in hashes:
            e = self._index.get(h)
            if e is None:
                break
            self._index.move_to_end(h)
            if lease_s > 0:
                e.lease_until = max(e.lease_until, until)
            n += 1
        return n

    # ---- two-phase put -------------------------------------------------------------------------------------------
    def reserve(self, hashes: Sequence[int], now: float | None = None) -> Reservation:
        """Phase 1: slots for the pages not held (and not being put by someone else). May evict; gets fewer
        slots (a prefix of the missing pages) when everything else is leased or being read."""
        now = time.monotonic() if now is None else now
        self.expire(now)
        pending = {h for p in self._pending.values() for h in p.hashes}
        want = [i for i, h in enumerate(hashes) if h not in self._index and h not in pending]
        present = len(hashes) - len(want)
        slots = self._take_slots(len(want), now)
        if len(slots) < len(want):
            self.counters.full += len(want) - len(slots)
        want = want[: len(slots)]
        if not want:
            return Reservation(0, (), (), present)
        put_id = next(self._put_ids)
        self._pending[put_id] = _Pending(tuple(hashes[i] for i in want), tuple(slots), now + self.lease_s)
        return Reservation(put_id, tuple(want), tuple(slots), present)

    def commit(self, put_id: int, crcs: Sequence[int], now: float | None = None) -> tuple[list[int], int]:
        """Phase 2: pages whose slot matches the caller's CRC become visible. Returns (stored hashes, rejected)."""
        p = self._pending.pop(put_id, None)
        if p is None:
            return [], 0  # expired (the slots went back) or never reserved
        stored: list[int] = []
        rejected = 0
        for i, (h, slot) in enumerate(zip(p.hashes, p.slots, strict=True)):
            crc = page_crc(self.buffer[slot])
            if i >= len(crcs) or crc != crcs[i] or h in self._index:
                rejected += i >= len(crcs) or crc != crcs[i]
                self._free.append(slot)
                continue
            self._index[h] = Entry(slot, crc)
            stored.append(h)
        self.counters.stored += len(stored)
        self.counters.rejected += rejected
        return stored, rejected

    def abort(self, put_id: int) -> None:
        p = self._pending.pop(put_id, None)
        if p is not None:
            self._free.extend(p.slots)

    @property
    def pending_puts(self) -> int:
        """Puts reserved and not yet committed, aborted or expired."""
        return len(self._pending)

    def expire(self, now: float | None = None) -> None:
        """Reclaim slots of puts never committed (the writer died): their writes may still be landing, but the
        writer's deadline is long past, and a reused slot is checked by CRC at its own commit anyway."""
        now = time.monotonic() if now is None else now
        for put_id in [k for k, p in self._pending.items() if p.expires <= now]:
            self.counters.expired_puts += 1
            self.abort(put_id)

    # ---- reads ---------------------------------------------------------------------------------------------------
    def begin_read(self, hashes: Sequence[int], now: float | None = None) -> Read:
        """Leading held pages, each verified against its CRC; a corrupt page is dropped and ends the read. The
        pages stay unevictable until end_read()."""
        out_h: list[int] = []
        out_s: list[int] = []
        out_c: list[int] = []
        corrupt = 0
        for h in hashes:
            e = self._index.get(h)
            if e is None:
                break
            if page_crc(self.buffer[e.slot]) != e.crc:
                corrupt += 1
                self.counters.corrupt += 1
                self.drop(h)
                break
            self._index.move_to_end(h)
            e.readers += 1
            out_h.append(h)
            out_s.append(e.slot)
            out_c.append(e.crc)
        return Read(tuple(out_h), tuple(out_s), tuple(out_c), corrupt)

    def end_read(self, read: Read) -> None:
        for h, slot in zip(read.hashes, read.slots, strict=True):
            e = self._index.get(h)
            if e is not None and e.slot == slot and e.readers:
                e.readers -= 1
            elif slot in self._orphans:
                self._orphans[slot] -= 1
                if not self._orphans[slot]:
                    del self._orphans[slot]
                    self._free.append(slot)

    # ---- eviction ------------------------------------------------------------------------------------------------
    def drop(self, h: int) -> bool:
        """Forget a page (corrupt, or its namespace reset); its slot is free once no read holds it."""
        e = self._index.pop(h, None)
        if e is None:
            return False
        self._removed.append(h)
        if e.readers:
            self._orphans[e.slot] = e.readers
        else:
            self._free.append(e.slot)
        return True

    def take_removed(self) -> list[int]:
        """Hashes evicted or dropped since the last call (the store publishes them as KV events)."""
        out, self._removed = self._removed, []
        return out

    def evict(self, n: int, now: float | None = None) -> list[int]:
        """Free up to n slots, least recently used first, skipping pages being read or leased."""
        now = time.monotonic() if now is None else now
        victims: list[int] = []
        for h, e in self._index.items():
            if len(victims) >= n:
                break
            if e.readers or e.lease_until > now:
                continue
            victims.append(h)
        for h in victims:
            e = self._index.pop(h)
            if self.evict_hook is not None:
                self.evict_hook(h, self.buffer[e.slot], e.crc)
            self._free.append(e.slot)
        self._removed.extend(victims)
        self.counters.evicted += len(victims)
        return victims

    def over_watermark(self, watermark: float) -> int:
        """Pages above `watermark` (share of the slots)."""
        return max(0, (self.num_slots - len(self._free)) - int(self.num_slots * watermark))

    def _take_slots(self, n: int, now: float) -> list[int]:
        short = n - len(self._free)
        if short > 0:
            self.evict(short, now)
        k = min(n, len(self._free))
        return [self._free.pop() for _ in range(k)]

    def entries(self) -> list[tuple[int, Entry]]:
        """(hash, entry), least recently used first (tests, demotion)."""
        return list(self._index.items())
