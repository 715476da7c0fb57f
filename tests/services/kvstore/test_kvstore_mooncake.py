"""T3 of the kvstore: chunks of pages in a real Mooncake Store (mooncake_master + its HTTP metadata server on
127.0.0.1). Demotion puts chunks, a fetch reads them back verified, a second client (another machine's kvstore)
finds them by page hash, the byte budget removes the oldest chunk, and with the master killed every call returns at
once (nothing found, nothing put) until a restarted master makes the tier work again.

The store clients' transfer engines listen on every interface (Mooncake binds them so); the master, its metadata
and admin servers are bound to 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from services.kvstore.remote import MooncakeTier, decode_chunk, encode_chunk
from shared.cluster.localcluster.servers import MooncakeMaster, free_port
from shared.modelspec.kv_layout import KVLayout

LAYOUT = KVLayout("float32", 4, 2, 1, 8)  # 256-byte pages
PB = LAYOUT.page_bytes


def _page(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (PB,), dtype=torch.uint8, generator=g)


def _crc(t: torch.Tensor) -> int:
    import zlib

    return zlib.crc32(t.numpy().tobytes())


def test_chunk_codec_round_trip_and_rejects_damage() -> None:
    pages = [(100 + i, _page(i), _crc(_page(i))) for i in range(3)]
    blob = encode_chunk(PB, pages)
    out = decode_chunk(blob, PB)
    assert out is not None and [h for h, _, _ in out] == [100, 101, 102]
    assert all(bytes(d) == p.numpy().tobytes() for (_, _, d), (_, p, _) in zip(out, pages, strict=True))
    assert decode_chunk(blob, PB * 2) is None  # another page size
    assert decode_chunk(blob[:-1], PB) is None  # short
    bad = bytearray(blob)
    bad[8] ^= 0xFF  # header byte: header CRC catches it
    assert decode_chunk(bytes(bad), PB) is None


def _tier(master: MooncakeMaster, budget: int = 1 << 20) -> MooncakeTier:
    t = MooncakeTier(
        master=master.address,
        metadata_url=master.metadata_url,
        host="127.0.0.1",
        segment_bytes=16 << 20,
        budget_bytes=budget,
        chunk_pages=4,
        timeout_s=2.0,
    )
    t.bind("tiny", LAYOUT)
    return t


async def _until(pred, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.e2e
def test_tier_put_fetch_share_budget_and_master_restart(tmp_path: Path) -> None:
    master = MooncakeMaster(tmp_path / "mc", free_port(), start_timeout_s=60.0)
    master.start()

    async def scenario() -> None:
        a = _tier(master, budget=3 * (4 * PB + 200))  # room for 3 chunks of 4 pages
        a.start()
        b: MooncakeTier | None = None
        try:
            await _until(lambda: a.up)
            pages = {h: _page(h) for h in range(1, 9)}
            slot = torch.empty(PB, dtype=torch.uint8)  # one DRAM slot, reused right after each eviction
            for h, p in pages.items():
                slot.copy_(p)
                a.demote(h, slot, _crc(p))
            await _until(lambda: a.counters.put_chunks == 2)
            got = await a.fetch(list(pages) + [99], limit=100)
            assert [h for h, _, _ in got] == list(pages)
            assert all(torch.equal(t, pages[h]) for h, t, _ in got)
            assert (await a.fetch([3, 4, 5], limit=2))[-1][0] == 4  # from mid-chunk, bounded by the limit

            # another kvstore finds the chunk by the page hash where its own tiers stop
            b = _tier(master)
            b.start()
            await _until(lambda: b.up)
            assert [h for h, _, _ in await b.fetch([1, 2, 3, 4, 5], limit=100)] == [1, 2, 3, 4, 5]

            # the byte budget: a third and fourth chunk push the first out (removed from the master too)
            for h in range(9, 17):
                a.demote(h, _page(h), _crc(_page(h)))
            await _until(lambda: a.counters.put_chunks == 4)
            assert a.counters.removed_chunks == 1 and 1 in a.take_removed()
            assert 1 not in a and 5 in a  # (the master removes the object once its read lease from b ends)
            assert a.used_bytes <= a.capacity_bytes

            # the master dies: calls fail fast, nothing is found or put, the tier reports down
            master.kill()
            t0 = time.monotonic()
            assert await a.fetch([5, 6], limit=10) == []
            assert time.monotonic() - t0 < 5.0
            assert not a.up
            a.demote(50, _page(50), _crc(_page(50)))
            assert a.counters.dropped_pages >= 1

            # a restarted master (empty): the tier comes back, forgets chunks the master lost, puts and fetches again
            master.start()
            await _until(lambda: a.up, timeout_s=30.0)
            assert await a.fetch([9], limit=1) == []  # the restarted master lost it: dropped from the index
            assert 9 not in a
            deadline = time.monotonic() + 60.0
            while a.counters.put_chunks < 5:
                assert time.monotonic() < deadline, "no put after the master came back"
                if len(a._staged) < 4 and a.up:  # a put that failed on a reconnecting client dropped its pages
                    for h in range(100, 104):
                        a.demote(h, _page(h), _crc(_page(h)))
                await asyncio.sleep(0.2)
            got = await a.fetch([100, 101, 102, 103], limit=10)
            assert [h for h, _, _ in got] == [100, 101, 102, 103]
        finally:
            await a.close()
            if b is not None:
                await b.close()

    try:
        asyncio.run(scenario())
    finally:
        master.stop()


def test_remote_tier_config_is_checked_and_off_when_unset() -> None:
    from types import SimpleNamespace

    from services.kvstore.service import open_remote_tier

    def k(**kw: object) -> SimpleNamespace:
        base: dict[str, object] = {
            "kvstore_mooncake_master": None,
            "kvstore_mooncake_metadata_url": None,
            "kvstore_mooncake_segment_bytes": 16 << 20,
            "kvstore_mooncake_bytes": 1 << 20,
            "kvstore_chunk_pages": 4,
            "kvstore_mooncake_timeout_s": 1.0,
        }
        return SimpleNamespace(**{**base, **kw})

    assert open_remote_tier(k(), "127.0.0.1") is None
    with pytest.raises(ValueError, match="--kvstore-mooncake-master 'nohost' is not HOST:PORT"):
        open_remote_tier(k(kvstore_mooncake_master="nohost"), "127.0.0.1")
    with pytest.raises(ValueError, match="needs --kvstore-mooncake-metadata-url"):
        open_remote_tier(k(kvstore_mooncake_master="127.0.0.1:1"), "127.0.0.1")
    t = open_remote_tier(
        k(kvstore_mooncake_master="127.0.0.1:1", kvstore_mooncake_metadata_url="http://x/m"), "127.0.0.1"
    )
    assert t is not None and not t.up and t.capacity_bytes == 1 << 20
