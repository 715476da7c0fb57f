"""Page checksums: equal to CRC-32 / XXH3 of the same bytes computed another way, order-sensitive, dtype-agnostic,
numbered as the proto's ChecksumAlgorithm."""

from __future__ import annotations

import time
import zlib

import pytest
import torch
import xxhash

from proto.pdrelay.v1 import worker_pb2
from shared.serving.handoff import checksums_to_pb, choose_checksum, handoff_checksums
from shared.transfer import device_checksum
from shared.transfer.checksum import PageChecksum, checksum_buffers, checksum_pages, crc32, page_crcs


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


def test_gpu_pools_negotiate_the_device_checksum() -> None:
    """A GPU pool offers (and prefers) WORDSUM64, which sums the pages where they are; host pools keep XXH3; a ticket
    with nothing this side runs is refused when it arrives, naming both lists."""
    gpu, host = handoff_checksums("cuda"), handoff_checksums("cpu")
    assert gpu == (PageChecksum.WORDSUM64, PageChecksum.XXH3_64, PageChecksum.CRC32)
    assert host == (PageChecksum.XXH3_64, PageChecksum.WORDSUM64, PageChecksum.CRC32)
    from_gpu = worker_pb2.HandoffTicket(checksums=checksums_to_pb(gpu))
    from_host = worker_pb2.HandoffTicket(checksums=checksums_to_pb(host))
    assert choose_checksum(from_gpu, gpu, "cuda") == PageChecksum.WORDSUM64
    assert choose_checksum(from_host, gpu, "cuda") == PageChecksum.WORDSUM64  # in place on the prefill's GPU
    assert choose_checksum(from_host, host, "cpu") == PageChecksum.XXH3_64  # host to host: unchanged
    assert choose_checksum(from_gpu, host, "cpu") == PageChecksum.WORDSUM64  # in place on decode's GPU
    with pytest.raises(ValueError, match=r"decode offers page checksums #9 and none of them runs here \(WORDSUM64"):
        choose_checksum(worker_pb2.HandoffTicket(checksums=[9]), gpu, "cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_device_checksum_equals_its_definition(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """WORDSUM64 of pages (in blocks and batches) equals the plain definition over the same bytes."""
    g = torch.Generator().manual_seed(7)
    pool = torch.randn(9, 2, 3, 40, generator=g).to(dtype)  # [pages, layers, K/V, ...]
    pages = [4, 0, 8, 8, 3]
    raw = b"".join(pool[p].view(torch.uint8).numpy().tobytes() for p in pages)
    want = device_checksum.reference(raw)
    assert checksum_pages(pool, pages, PageChecksum.WORDSUM64) == want
    monkeypatch.setattr(device_checksum, "_BLOCK", 16)  # several rows per page
    monkeypatch.setattr(device_checksum, "_BATCH_BYTES", 1)  # one page per batch
    assert checksum_pages(pool, pages, PageChecksum.WORDSUM64) == want
    assert want >> 32 < device_checksum.MODULUS and want & 0xFFFFFFFF < device_checksum.MODULUS


def test_device_checksum_of_extreme_words() -> None:
    """All-ones words (the largest sums) and zeros: exact, no overflow."""
    ones = torch.full((3, 1 << 16), -1, dtype=torch.int16)
    raw = ones.numpy().tobytes()
    assert checksum_pages(ones, [0, 1, 2], PageChecksum.WORDSUM64) == device_checksum.reference(raw)
    assert checksum_pages(torch.zeros(2, 8), [0, 1], PageChecksum.WORDSUM64) == 0


@pytest.mark.gpu
def test_gpu_pages_checksum_where_they_are_and_as_on_the_host() -> None:
    """Bit-identical on the GPU and the CPU for the same bytes; the host hashes of GPU pages work too (a copy)."""
    pool = torch.randn(64, 2, 16, 8, 128, dtype=torch.bfloat16)
    pages = list(range(63, -1, -3))
    on_gpu = pool.cuda()
    for algorithm in PageChecksum:
        assert checksum_pages(on_gpu, pages, algorithm) == checksum_pages(pool, pages, algorithm)
    assert page_crcs(on_gpu, pages[:4]) == page_crcs(pool, pages[:4])


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
