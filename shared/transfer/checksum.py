"""Checksums of KV pages for hand-off verification: the writer sums what it sent, the receiver what it got.

Over the raw page bytes, in page order (both sides agree whenever the same bytes sit in the same page order,
whatever the pool's dtype), with one of three algorithms (their numbers are worker.proto's ChecksumAlgorithm):

    CRC32     CRC-32 (zlib's polynomial and values), chained, computed by zlib-ng: ~57 GB/s on a 720 KiB page here
              against ~4.3 GB/s for the system zlib (blake2b ~0.9 GB/s, sha256 ~1.8 GB/s); the kvstore's per-page
              sums (stored with the page) and the encoder's embeddings use it
    XXH3_64   XXH3's 64-bit hash, streamed: 45 MiB in ~2 ms (the system zlib's CRC-32 took ~17 ms when this was
              chosen); host pools' hand-offs use it, since both sides sum every written page on the TTFT path
    WORDSUM64 position-weighted sums of the bytes as little-endian 16-bit words, computed by torch where the pages
              are (device_checksum.py): a GPU pool's hand-off sums its pages on the GPU, with no host copy

CRC32 and XXH3 of pages in device memory are computed on a host copy of them (in batches), so no page is ever
refused for where it lives; hand-offs negotiate WORDSUM64 for GPU pools (handoff.py). Each algorithm catches
corruption and misplaced pages; none is a defence against a malicious peer.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import xxhash

# CRC-32 with zlib.crc32's values and signature (data, value=0), chained as zlib's, at zlib-ng's speed. Every CRC-32
# of KV pages, kvstore objects and embeddings comes from here: the kvstore's pages are summed by the writer, again
# at commit and on every Get, so at zlib's ~4.3 GB/s one thread would cap the store's ingest near 4 GB/s.
from zlib_ng.zlib_ng import crc32

from shared.transfer.device_checksum import wordsum64

# Pages of a device pool are copied to the host at most this many bytes at a time for a host algorithm.
_STAGE_BYTES = 64 << 20


class PageChecksum(enum.IntEnum):
    """The algorithms, numbered as worker.proto's ChecksumAlgorithm."""

    CRC32 = 1
    XXH3_64 = 2
    WORDSUM64 = 3


# Where each algorithm runs without moving the pages: a torch reduction runs on any torch device; the byte hashes
# run on the CPU (device pages are copied to the host for them).
IN_PLACE: dict[PageChecksum, frozenset[str]] = {
    PageChecksum.CRC32: frozenset({"cpu"}),
    PageChecksum.XXH3_64: frozenset({"cpu"}),
    PageChecksum.WORDSUM64: frozenset({"cpu", "cuda"}),
}


def runs_in_place(algorithm: PageChecksum, device_type: str) -> bool:
    return device_type in IN_PLACE[algorithm]


def _bytes_view(t: Any) -> memoryview:
    # A contiguous CPU tensor viewed as raw bytes without a copy; bf16 has no numpy dtype, so view as uint8 first.
    import torch

    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        raise ValueError("checksum needs contiguous pages: pass pool[page_id] of a page-major pool")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _check_ids(num_pages: int, page_ids: Sequence[int]) -> None:
    for p in page_ids:
        if not 0 <= p < num_pages:
            raise ValueError(f"page id {p} is outside the pool's {num_pages} pages")


def _host_pages(pool: Any, page_ids: Sequence[int]) -> Iterator[memoryview]:
    """Each page's bytes on the host, in order: views of a host pool, batched copies of a device pool."""
    import torch

    if pool.device.type == "cpu":
        for p in page_ids:
            yield _bytes_view(pool[p])
        return
    per_batch = max(1, _STAGE_BYTES // max(1, pool[0].numel() * pool.element_size()))
    for start in range(0, len(page_ids), per_batch):
        ids = torch.tensor(page_ids[start : start + per_batch], dtype=torch.int64, device=pool.device)
        host = pool.index_select(0, ids).cpu()
        for row in host:
            yield _bytes_view(row)


def checksum_pages(pool: Any, page_ids: Iterable[int], algorithm: PageChecksum = PageChecksum.CRC32) -> int:
    """The checksum of pool[p] for p in page_ids, in order; pool is page-major [num_pages, ...] (one page
    contiguous), in host or device memory."""
    ids = list(page_ids)
    _check_ids(pool.shape[0], ids)
    if algorithm == PageChecksum.WORDSUM64:
        return wordsum64(pool, ids)
    if algorithm == PageChecksum.XXH3_64:
        h = xxhash.xxh3_64()
        for view in _host_pages(pool, ids):
            h.update(view)
        return h.intdigest()
    if algorithm != PageChecksum.CRC32:
        raise ValueError(f"unknown page checksum algorithm {algorithm!r}")
    crc = 0
    for view in _host_pages(pool, ids):
        crc = crc32(view, crc)
    return crc


def page_crcs(pool: Any, page_ids: Iterable[int]) -> list[int]:
    """CRC-32 of each page on its own (what the kvstore stores with a page), host or device pool."""
    ids = list(page_ids)
    _check_ids(pool.shape[0], ids)
    return [crc32(view) for view in _host_pages(pool, ids)]


def checksum_buffers(buffers: Iterable[Any]) -> int:
    """CRC-32 chained over byte buffers (bytes, memoryviews, numpy arrays) or contiguous tensors, in order."""
    crc = 0
    for b in buffers:
        crc = crc32(_bytes_view(b) if hasattr(b, "data_ptr") else b, crc)
    return crc
