"""Huge-page host buffers: aligned, zeroed, right shape and dtype, and actually backed by huge pages."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from shared.engine.hostmem import HUGE_PAGE, alloc_host_buffer, populate
from tests.helpers.smaps import mapping_kib


def test_shape_dtype_alignment_and_zeroes() -> None:
    t = alloc_host_buffer((3, 5, 7), torch.bfloat16)
    gc.collect()  # the tensor alone must keep its mapping alive
    assert (t.shape, t.dtype, t.is_contiguous()) == ((3, 5, 7), torch.bfloat16, True)
    assert t.data_ptr() % HUGE_PAGE == 0
    assert not t.any()
    t.fill_(2.0)
    assert float(t.float().sum()) == 2.0 * 3 * 5 * 7


def test_rejects_empty_shape() -> None:
    with pytest.raises(ValueError, match="non-empty shape"):
        alloc_host_buffer((0, 4))


def _anon_huge_kib(addr: int) -> int:
    return mapping_kib(addr, "AnonHugePages")


def test_backed_by_huge_pages_where_the_kernel_allows() -> None:
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        pytest.skip("transparent huge pages are off on this kernel")
    t = alloc_host_buffer((8 << 20,), torch.uint8)  # 8 MiB
    t.fill_(1)  # first touch
    assert _anon_huge_kib(t.data_ptr()) >= 4096  # at least half of it on 2 MiB pages
    plain = torch.ones(8 << 20, dtype=torch.uint8)
    print(
        f"huge-page buffer: {_anon_huge_kib(t.data_ptr())} KiB on huge pages; torch.ones: {_anon_huge_kib(plain.data_ptr())}"
    )


def _rss_kib(addr: int) -> int:
    return mapping_kib(addr, "Rss")


def test_populate_backs_pages_without_changing_them() -> None:
    if not Path("/proc/self/smaps").exists():
        pytest.skip("needs Linux /proc")
    t = alloc_host_buffer((16 << 20,), torch.uint8)  # 16 MiB, untouched: not resident yet
    t[: 4 << 20] = 7  # the first 4 MiB already hold data
    before = _rss_kib(t.data_ptr())
    if not populate(t.data_ptr(), t.numel()):
        pytest.skip("MADV_POPULATE_WRITE needs Linux >= 5.14")
    assert _rss_kib(t.data_ptr()) >= before + 10 * 1024  # the untouched 12 MiB are now backed
    assert int(t[: 4 << 20].min()) == 7 and int(t[: 4 << 20].max()) == 7  # data kept
    assert not t[4 << 20 :].any()  # the rest still reads as zeros
    assert not populate(t.data_ptr(), 0)


def test_populate_in_background_backs_the_whole_buffer_in_chunks(monkeypatch) -> None:
    from shared.engine import hostmem

    if not Path("/proc/self/smaps").exists():
        pytest.skip("needs Linux /proc")
    monkeypatch.setattr(hostmem, "POPULATE_CHUNK_BYTES", 3 << 20)  # several chunks, the last one short
    t = alloc_host_buffer((16 << 20,), torch.uint8)  # 16 MiB, untouched
    t[:1024] = 9
    if not populate(t.data_ptr(), 4096):
        pytest.skip("MADV_POPULATE_WRITE needs Linux >= 5.14")
    before = _rss_kib(t.data_ptr())
    th = hostmem.populate_in_background(t, "test buffer")
    assert th.daemon
    th.join(timeout=30)
    assert not th.is_alive()
    assert before < 15 * 1024 <= _rss_kib(t.data_ptr())  # all 16 MiB backed now, not before
    assert int(t[:1024].min()) == 9 == int(t[:1024].max())  # data kept
    assert not t[1024:].any()
