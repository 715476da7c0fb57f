"""The kvstore's DRAM tier is faulted in at start: a caller's first Put into a slot must not pay for the page faults
inside its own transfer call (process_vm_writev faults the store's pages in on the writer's thread)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.kvstore.store import PageStore
from shared.engine.hostmem import populate
from tests.helpers.smaps import mapping_kib


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
        while mapping_kib(buf.data_ptr(), "Rss") < 31 * 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mapping_kib(buf.data_ptr(), "Rss") >= 31 * 1024, "the whole 32 MiB tier is resident"
        assert not buf.any()  # populating never changes the contents
    finally:
        store.engine.close()
