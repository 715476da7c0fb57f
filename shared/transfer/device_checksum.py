"""WORDSUM64: a checksum of KV pages computed by torch where the pages are (GPU or CPU), bit-identical on both.

The pages' bytes, in page order, read as little-endian unsigned 16-bit words w_0 .. w_{n-1}:

    S1 = sum(w_i)           mod P        P = 2**31 - 1
    S2 = sum((i + 1) * w_i) mod P
    WORDSUM64 = S2 << 32 | S1

Integer sums are exact, so the order in which a GPU reduces them cannot change the result (floating-point sums
would): each block of at most _BLOCK words is summed on the device (int32 partial sums of 128 words, combined in
int64; no overflow: _BLOCK**2 / 2 x 65535 < 2**63), the per-block sums come to the host (two int64 per block) and
are combined there with the block offsets in Python integers. A change of one word changes S1; a swap of two different words or pages changes S2 (Fletcher's
and Adler's position weighting, over a prime modulus). reference() is the plain definition, for tests.

Cost: one gather of the pages (bounded batches) and two int64 reductions on the device; on a host pool torch is
slower than XXH3, which is why host pools keep XXH3 (checksum.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

MODULUS = (1 << 31) - 1
_BLOCK = 1 << 22  # words per device row: 8 MiB of pages
_BATCH_BYTES = 32 << 20  # page bytes gathered at once (their int64 words take 4x that on the device)


_SUB = 128  # words per int32 partial sum: 128 x 129 / 2 x 65535 < 2**31


@functools.cache
def _weights(device: str) -> Any:
    import torch

    return torch.arange(1, _SUB + 1, dtype=torch.int32, device=device)


@functools.cache
def _block_size(words: int) -> int:
    """The largest divisor of a page's word count that is at most _BLOCK (rows never straddle pages)."""
    if words <= _BLOCK:
        return words
    for k in range(2, words + 1):
        if words % k == 0 and words // k <= _BLOCK:
            return words // k
    return 1


def _row_sums(rows: Any) -> tuple[Any, Any]:
    """Per row of unsigned 16-bit words (int16 storage) [rows, n]: (sum w_t, sum (t + 1) w_t) as int64.

    Sub-blocks of _SUB words are summed in int32 (half the memory traffic of int64, and exact by the bound above);
    the sub-block sums are combined in int64 with their offsets."""
    import torch
    import torch.nn.functional as F

    n = rows.shape[1]
    w = rows.to(torch.int32) & 0xFFFF
    if n % _SUB:
        w = F.pad(w, (0, _SUB - n % _SUB))  # zeros add nothing to either sum
    w = w.view(rows.shape[0], -1, _SUB)  # [rows, subs, _SUB]
    a = w.sum(dim=2, dtype=torch.int32)  # [rows, subs]
    b = (w * _weights(str(rows.device))).sum(dim=2, dtype=torch.int32)
    offsets = torch.arange(a.shape[1], dtype=torch.int64, device=rows.device) * _SUB
    a64 = a.to(torch.int64)
    return a64.sum(dim=1), (a64 * offsets).sum(dim=1) + b.sum(dim=1, dtype=torch.int64)


def wordsum64(pool: Any, page_ids: Sequence[int]) -> int:
    """WORDSUM64 of pool[p] for p in page_ids, in order; pool is page-major [num_pages, ...] on any torch device."""
    import torch

    page_bytes = pool[0].numel() * pool.element_size()
    if page_bytes % 2:
        raise ValueError(f"WORDSUM64 sums 16-bit words; a page of {page_bytes} bytes is not a whole number of them")
    words = page_bytes // 2
    block = _block_size(words)
    per_batch = max(1, _BATCH_BYTES // page_bytes)
    s1 = s2 = 0
    for start in range(0, len(page_ids), per_batch):
        batch = page_ids[start : start + per_batch]
        ids = torch.tensor(batch, dtype=torch.int64, device=pool.device)
        raw = pool.index_select(0, ids).reshape(len(batch), -1).view(torch.int16)  # [pages, words], raw bytes
        a, b = _row_sums(raw.reshape(-1, block))
        first = start * words  # global index of this batch's first word
        for r, (ar, br) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
            s1 += ar
            s2 += (first + r * block) * ar + br
        s1 %= MODULUS
        s2 %= MODULUS
    return (s2 << 32) | s1


def reference(data: bytes) -> int:
    """The definition over a byte string (the pages concatenated), in plain Python: what wordsum64 must equal."""
    import numpy as np

    w = np.frombuffer(data, dtype="<u2").astype(np.int64)
    s1 = int(w.sum()) % MODULUS
    s2 = sum(int(x) * (i + 1) for i, x in enumerate(w.tolist())) % MODULUS
    return (s2 << 32) | s1
