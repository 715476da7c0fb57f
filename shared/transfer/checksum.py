"""Checksums of KV pages for hand-off verification: the writer sums what it sent, the receiver what it got.

CRC-32 (zlib) over the raw page bytes, chained in page order, so both sides agree whenever the same bytes sit in the
same page order, whatever the pool's dtype. zlib's CRC-32 measured ~4 GB/s on 64 MiB here (blake2b ~0.9 GB/s,
sha256 ~1.8 GB/s), and it releases the GIL on large buffers. It catches corruption and misplaced pages; it is not
a defence against a malicious peer.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any


def _bytes_view(t: Any) -> memoryview:
    # A contiguous CPU tensor viewed as raw bytes without a copy; bf16 has no numpy dtype, so view as uint8 first.
    import torch

    if t.device.type != "cpu":
        raise ValueError(f"checksum needs CPU memory (got a tensor on {t.device}); copy the pages to the host first")
    if not t.is_contiguous():
        raise ValueError("checksum needs contiguous pages: pass pool[page_id] of a page-major pool")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def checksum_pages(pool: Any, page_ids: Iterable[int]) -> int:
    """CRC-32 over pool[p] for p in page_ids, in order; pool is page-major [num_pages, ...] (one page contiguous)."""
    crc = 0
    num_pages = pool.shape[0]
    for p in page_ids:
        if not 0 <= p < num_pages:
            raise ValueError(f"page id {p} is outside the pool's {num_pages} pages")
        crc = zlib.crc32(_bytes_view(pool[p]), crc)
    return crc


def checksum_buffers(buffers: Iterable[Any]) -> int:
    """CRC-32 chained over byte buffers (bytes, memoryviews, numpy arrays) or contiguous CPU tensors, in order."""
    crc = 0
    for b in buffers:
        crc = zlib.crc32(_bytes_view(b) if hasattr(b, "data_ptr") else b, crc)
    return crc
