"""Page checksums: equal to CRC-32 / XXH3 of the same bytes computed another way, order-sensitive, dtype-agnostic,
numbered as the proto's ChecksumAlgorithm."""

from __future__ import annotations

import time
import zlib

import pytest
import torch
import xxhash

from proto.pdrelay.v1 import worker_pb2
from shared.serving.handoff import checksums_to_pb, choose_checksum
from shared.transfer.checksum import PageChecksum, checksum_buffers, checksum_pages, crc32


def test_matches_crc32_of_the_concatenated_page_bytes() -> None:
    pool = torch.randn(8, 3, 2, 16)  # [num_pages, layers, K/V, tokens]
    pages = [5, 0, 7]
    expected = zlib.crc32(b"".join(pool[p].numpy().tobytes() for p in pages))
    assert checksum_pages(pool, pages) == expected
    assert checksum_buffers([pool[p] for p in pages]) == expected
    assert checksum_buffers([pool[p].numpy().tobytes() for p in pages]) == expected


@pytest.mark.parametrize("size", [0, 1, 15, 16, 63, 4096, 737_281])
def test_fast_crc32_is_zlibs_crc32(size: int) -> None:
    """The stored sums (kvstore pages, disk and Mooncake Store objects) stay readable: zlib-ng's CRC-32 is zlib's,
    chained included, at every length the SIMD paths split differently."""
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(size)).numpy()
    raw = data.tobytes()
    assert crc32(data) == zlib.crc32(raw)
    assert crc32(raw[size // 3 :], crc32(raw[: size // 3])) == zlib.crc32(raw)
    assert crc32(memoryview(raw), 12345) == zlib.crc32(raw, 12345)


def test_xxh3_matches_the_hash_of_the_concatenated_page_bytes() -> None:
    pool = torch.randn(8, 3, 2, 16)
    pages = [5, 0, 7]
    expected = xxhash.xxh3_64_intdigest(b"".join(pool[p].numpy().tobytes() for p in pages))
    assert checksum_pages(pool, pages, PageChecksum.XXH3_64) == expected
    assert expected != checksum_pages(pool, pages)  # not CRC-32


def test_algorithms_are_numbered_as_the_proto() -> None:
    for a in PageChecksum:
        assert worker_pb2.ChecksumAlgorithm.Value(f"CHECKSUM_ALGORITHM_{a.name}") == a.value
    with pytest.raises(ValueError, match="unknown page checksum"):
        checksum_pages(torch.zeros(2, 8), [0], 7)  # type: ignore[arg-type]


def test_prefill_sums_with_the_first_algorithm_the_ticket_names_that_it_knows() -> None:
    assert choose_checksum(worker_pb2.HandoffTicket(checksums=checksums_to_pb())) == PageChecksum.XXH3_64
    assert choose_checksum(worker_pb2.HandoffTicket()) == PageChecksum.CRC32  # a decode that knows only CRC-32
    assert choose_checksum(worker_pb2.HandoffTicket(checksums=[9, 1])) == PageChecksum.CRC32  # 9: not known here


@pytest.mark.parametrize("algorithm", list(PageChecksum))
def test_detects_swapped_pages_and_single_bit_flips(algorithm: PageChecksum) -> None:
    pool = torch.randn(4, 256)
    base = checksum_pages(pool, [0, 1, 2], algorithm)
    assert checksum_pages(pool, [1, 0, 2], algorithm) != base
    flipped = pool.clone()
    flipped.view(torch.int32)[2, 17] ^= 1
    assert checksum_pages(flipped, [0, 1, 2], algorithm) != base


def test_bfloat16_pages() -> None:
    pool = torch.randn(4, 64).to(torch.bfloat16)  # numpy has no bf16: the bytes are viewed as uint8
    assert checksum_pages(pool, [2]) == zlib.crc32(pool[2].view(torch.int16).numpy().tobytes())


def test_rejects_bad_input() -> None:
    pool = torch.zeros(4, 64)
    with pytest.raises(ValueError, match="page id 4 is outside"):
        checksum_pages(pool, [4])
    with pytest.raises(ValueError, match="contiguous"):
        checksum_pages(torch.zeros(4, 8, 8).transpose(1, 2), [0])


def test_speed_on_64_mib() -> None:
    pool = torch.randn(64, 256 * 1024)  # 64 pages x 1 MiB = 64 MiB
    checksum_pages(pool, range(64))
    t0 = time.perf_counter()
    checksum_pages(pool, range(64))
    gbps = pool.nbytes / (time.perf_counter() - t0) / 1e9
    print(f"checksum_pages: {gbps:.2f} GB/s on 64 MiB")
    assert gbps > 0.3, f"{gbps:.2f} GB/s: CRC-32 should run at several GB/s"
