"""Checksums of KV pages for hand-off verification: the writer sums what it sent, the receiver what it got.

Over the raw page bytes, in page order (both sides agree whenever the same bytes sit in the same page order,
whatever the pool's dtype), with one of two algorithms (their numbers are worker.proto's ChecksumAlgorithm):

    CRC32     CRC-32 (zlib's polynomial and values), chained, computed by zlib-ng: ~57 GB/s on a 720 KiB page here
              against ~4.3 GB/s for the system zlib (blake2b ~0.9 GB/s, sha256 ~1.8 GB/s); the kvstore's per-page
              sums (stored with the page) and the encoder's embeddings use it
    XXH3_64   XXH3's 64-bit hash, streamed: 45 MiB in ~2 ms (the system zlib's CRC-32 took ~17 ms when this was
              chosen); the prefill -> decode hand-off uses it, since both of its sides sum every written page on
              the request's TTFT path

Either catches corruption and misplaced pages; neither is a defence against a malicious peer.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import xxhash

# CRC-32 with zlib.crc32's values and signature (data, value=0), chained as zlib's, at zlib-ng's speed. Every CRC-32
# of KV pages, kvstore objects and embeddings comes from here: the kvstore's pages are summed by the writer, again
# at commit and on every Get, so at zlib's ~4.3 GB/s one thread would cap the store's ingest near 4 GB/s.
from zlib_ng.zlib_ng import crc32


class PageChecksum(enum.IntEnum):
    """The algorithms, numbered as worker.proto's ChecksumAlgorithm."""

    CRC32 = 1
    XXH3_64 = 2


def _bytes_view(t: Any) -> memoryview:
    # A contiguous CPU tensor viewed as raw bytes without a copy; bf16 has no numpy dtype, so view as uint8 first.
    import torch

    if t.device.type != "cpu":
        raise ValueError(f"checksum needs CPU memory (got a tensor on {t.device}); copy the pages to the host first")
    if not t.is_contiguous():
        raise ValueError("checksum needs contiguous pages: pass pool[page_id] of a page-major pool")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def checksum_pages(pool: Any, page_ids: Iterable[int], algorithm: PageChecksum = PageChecksum.CRC32) -> int:
    """The checksum of pool[p] for p in page_ids, in order; pool is page-major [num_pages, ...] (one page
    contiguous)."""
    num_pages = pool.shape[0]

    def pages() -> Iterable[memoryview]:
        for p in page_ids:
            if not 0 <= p < num_pages:
                raise ValueError(f"page id {p} is outside the pool's {num_pages} pages")
            yield _bytes_view(pool[p])

    if algorithm == PageChecksum.XXH3_64:
        h = xxhash.xxh3_64()
        for view in pages():
            h.update(view)
        return h.intdigest()
    if algorithm != PageChecksum.CRC32:
        raise ValueError(f"unknown page checksum algorithm {algorithm!r}")
    crc = 0
    for view in pages():
        crc = crc32(view, crc)
    return crc


def checksum_buffers(buffers: Iterable[Any]) -> int:
    """CRC-32 chained over byte buffers (bytes, memoryviews, numpy arrays) or contiguous CPU tensors, in order."""
    crc = 0
    for b in buffers:
        crc = crc32(_bytes_view(b) if hasattr(b, "data_ptr") else b, crc)
    return crc
