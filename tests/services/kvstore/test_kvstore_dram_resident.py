"""The kvstore's DRAM tier is faulted in at start: a caller's first Put into a slot must not pay for the page faults
inside its own transfer call (process_vm_writev faults the store's pages in on the writer's thread)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.kvstore.store import PageStore
from shared.kernels.hostmem import populate


def _rss_kib(addr: int) -> int:
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1])
    return 0


def test_allocate_makes_the_dram_tier_resident_in_the_background() -> None:
    if not Path("/proc/self/smaps").exists():
        pytest.skip("needs Linux /proc")
    store = PageStore(
        name="kvstore-resident-test",
        backend="nixl",
        host="127.0.0.1",
        dram_bytes=32 << 20,
        lease_s=5.0,
        high_watermark=0.9,
    )
    try:
        store.allocate()
        buf = store._buffer
        assert buf is not None
        if not populate(buf.data_ptr(), 4096):
            pytest.skip("MADV_POPULATE_WRITE needs Linux >= 5.14")
        deadline = time.monotonic() + 20
        while _rss_kib(buf.data_ptr()) < 31 * 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _rss_kib(buf.data_ptr()) >= 31 * 1024, "the whole 32 MiB tier is resident"
        assert not buf.any()  # populating never changes the contents
    finally:
        store.engine.close()
