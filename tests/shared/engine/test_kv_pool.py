"""KVPool: one page-major buffer; views alias it; writes land at (page, offset); page bytes and checksums."""

from __future__ import annotations

import pytest
import torch

from shared.engine.kv_pool import KVPool, num_pages_for_budget
from shared.modelspec.kv_layout import KVLayout

LAYOUT = KVLayout(dtype="float32", page_size=4, num_layers=3, num_kv_heads=2, head_dim=8)


def test_buffer_shape_and_page_bytes() -> None:
    pool = KVPool(LAYOUT, 5)
    assert pool.buffer.shape == (5, 3, 2, 4, 2, 8)
    assert pool.buffer.is_contiguous()
    assert pool.bytes_per_page == LAYOUT.page_bytes == 3 * 2 * 4 * 2 * 8 * 4
    assert pool.nbytes == 5 * pool.bytes_per_page
    page = pool.page_view(3)
    assert page.is_contiguous() and page.numel() * page.element_size() == pool.bytes_per_page
    assert page.data_ptr() == pool.page_ptr(3) == pool.data_ptr() + 3 * pool.bytes_per_page


def test_layer_views_alias_the_buffer() -> None:
    pool = KVPool(LAYOUT, 4)
    assert pool.k(1).shape == (4, 4, 2, 8)
    pool.k(1)[2, 3] = 7.0
    pool.v(2)[0, 1] = -3.0
    assert (pool.buffer[2, 1, 0, 3] == 7.0).all() and (pool.buffer[0, 2, 1, 1] == -3.0).all()
    assert torch.equal(pool.k_rows(1)[2].view(4, 2, 8), pool.k(1)[2])
    assert torch.equal(pool.v_rows(2)[0].view(4, 2, 8), pool.v(2)[0])


def test_write_places_each_token_at_its_slot_and_nowhere_else() -> None:
    pool = KVPool(LAYOUT, 6)
    g = torch.Generator().manual_seed(0)
    pages, offsets = torch.tensor([4, 4, 1, 5]), torch.tensor([2, 3, 0, 1])
    k, v = torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g)
    pool.write(2, pages, offsets, k, v)
    for i in range(4):
        assert torch.equal(pool.k(2)[pages[i], offsets[i]], k[i])
        assert torch.equal(pool.v(2)[pages[i], offsets[i]], v[i])
    written = torch.zeros(pool.buffer.shape, dtype=torch.bool)
    written[pages, 2, :, offsets] = True
    assert (pool.buffer[~written] == 0).all()  # other layers, pages and slots untouched


def test_pages_bytes_and_checksum_follow_contents() -> None:
    pool = KVPool(LAYOUT, 4)
    pool.buffer.normal_(generator=torch.Generator().manual_seed(1))
    raw = pool.pages_bytes([2, 0])
    assert raw.dtype == torch.uint8 and raw.numel() == 2 * pool.bytes_per_page
    assert torch.equal(raw[: pool.bytes_per_page], pool.page_view(2).contiguous().view(torch.uint8).reshape(-1))
    before = pool.pages_checksum([2, 0])
    assert pool.pages_checksum([0, 2]) != before  # order matters
    pool.page_view(0)[1, 0, 2, 1, 5] += 1.0
    assert pool.pages_checksum([2, 0]) != before


def test_num_pages_for_budget() -> None:
    assert num_pages_for_budget(LAYOUT, 10 * LAYOUT.page_bytes + 5) == 10
    with pytest.raises(ValueError, match="raise the budget"):
        num_pages_for_budget(LAYOUT, LAYOUT.page_bytes - 1)


def test_bf16_pool_and_bad_dtype() -> None:
    pool = KVPool(KVLayout("bfloat16", 4, 1, 1, 8), 2)
    assert pool.buffer.dtype == torch.bfloat16 and pool.bytes_per_page == 1 * 2 * 4 * 1 * 8 * 2
    with pytest.raises(ValueError, match="float8"):
        KVPool(KVLayout("float8", 4, 1, 1, 8), 2)


def test_prefault_populates_each_page_once_and_keeps_contents() -> None:
    from shared.engine.hostmem import populate

    pool = KVPool(LAYOUT, num_pages=8)
    pool.page_view(2).fill_(3.0)
    if not populate(pool.page_ptr(0), pool.bytes_per_page):
        pytest.skip("MADV_POPULATE_WRITE needs Linux >= 5.14")
    assert pool.prefault([2, 3, 5, 3]) == 3  # two runs (2-3 and 5), duplicates once
    assert pool.prefault([2, 3, 5]) == 0  # already resident
    assert pool.prefault([1, 2, 3, 4, 5, 6]) == 3
    assert float(pool.page_view(2).min()) == 3.0 and float(pool.page_view(2).max()) == 3.0
    assert not pool.page_view(4).any()


def test_populate_in_background_makes_every_page_resident_and_keeps_contents(monkeypatch) -> None:
    from shared.engine.hostmem import populate

    monkeypatch.setattr("shared.engine.hostmem.POPULATE_CHUNK_BYTES", 3 * LAYOUT.page_bytes)  # several chunks
    pool = KVPool(LAYOUT, num_pages=10)
    if not populate(pool.page_ptr(9), pool.bytes_per_page):
        pytest.skip("MADV_POPULATE_WRITE needs Linux >= 5.14")
    pool.page_view(4).fill_(2.5)  # written before: kept
    t = pool.populate_in_background()
    assert t is not None and t.daemon
    t.join(timeout=30)
    assert not t.is_alive()
    assert pool.prefault(range(10)) == 0, "every page is resident"
    assert float(pool.page_view(4).min()) == 2.5 == float(pool.page_view(4).max())
    assert not pool.page_view(5).any() and not pool.page_view(0).any()
