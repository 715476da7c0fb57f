"""KV page pack / unpack: gather scattered pages of the page-major KV pool into one contiguous transfer buffer,
and scatter such a buffer back into pages.

    pool:   [num_pages, num_layers, 2, page_size, kv_heads, head_dim] (shared.engine.kv_pool), page-major, so one
            page is one contiguous run of `page_numel` elements
    buffer: [n, num_layers, 2, page_size, kv_heads, head_dim], pages in the order of `page_ids`

Pages are copied as raw 32-bit words (16-bit or bytes when a page's size needs it), so the kernel moves any
dtype bit-exactly and never converts. A transfer engine registers the buffer once and sends it with one
descriptor instead of one per page. The torch references are `pack_pages_reference` (index_select) and
`unpack_pages_reference` (index_copy_).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton.language as tl

from shared.kernels.triton.launch import triton_kernel

__all__ = ["pack_pages", "pack_pages_reference", "unpack_pages", "unpack_pages_reference"]

_BLOCK = 2048  # words per program


@triton_kernel
def _copy_pages_kernel(Src, Dst, Ids, words, src_stride, dst_stride, BLOCK: tl.constexpr, PACK: tl.constexpr):
    i = tl.program_id(0)
    page = tl.load(Ids + i).to(tl.int64)
    if PACK:  # pool page `page` -> buffer row i
        src_row, dst_row = page, i.to(tl.int64)
    else:  # buffer row i -> pool page `page`
        src_row, dst_row = i.to(tl.int64), page
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < words
    vals = tl.load(Src + src_row * src_stride + cols, mask=mask)
    tl.store(Dst + dst_row * dst_stride + cols, vals, mask=mask)


def pack_pages_reference(pool: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    return pool.index_select(0, page_ids)


def unpack_pages_reference(buffer: torch.Tensor, pool: torch.Tensor, page_ids: torch.Tensor) -> None:
    pool.index_copy_(0, page_ids, buffer)


def _words(t: torch.Tensor, name: str) -> torch.Tensor:
    """[rows, ...] with each row contiguous -> [rows, words] raw view (int32, int16 or uint8 words)."""
    if t.dim() < 1 or not t[0].is_contiguous():
        raise ValueError(f"{name} must hold one contiguous page per row of dim 0 (got strides {t.stride()})")
    row_bytes = t[0].numel() * t.element_size()
    if t.stride(0) * t.element_size() < row_bytes:
        raise ValueError(f"{name}'s pages overlap (stride {t.stride(0)} < page size {t[0].numel()})")
    word = torch.int32 if row_bytes % 4 == 0 else torch.int16 if row_bytes % 2 == 0 else torch.uint8
    flat = t.as_strided((t.shape[0], t[0].numel()), (t.stride(0), 1))  # [rows, page_numel]
    return flat.view(word)


def _ids(
    page_ids: torch.Tensor | Sequence[int], num_pages: int, device: torch.device, validate: bool, distinct: bool
) -> torch.Tensor:
    """page_ids -> int64 [n] on `device`. The kernel has no bounds checks (a bad id reads or corrupts memory
    outside the pool), so ids are checked first: for free when they come from the host, with a device sync when
    they are a device tensor (skip it with validate=False when the ids come from the page allocator)."""
    if isinstance(page_ids, torch.Tensor):
        ids = page_ids.to(device=device, dtype=torch.int64)
        check = validate and ids.numel() > 0
        lo, hi = (int(ids.min()), int(ids.max())) if check else (0, 0)
        dup = check and distinct and torch.unique(ids).numel() != ids.numel()
    else:
        host = [int(p) for p in page_ids]
        lo, hi = (min(host), max(host)) if host else (0, 0)
        dup = distinct and len(set(host)) != len(host)
        ids = torch.tensor(host, dtype=torch.int64, device=device)
    if ids.dim() != 1:
        raise ValueError(f"page_ids must be one-dimensional, got shape {tuple(ids.shape)}")
    if lo < 0 or hi >= num_pages:
        raise ValueError(f"page_ids must lie in [0, {num_pages}); got min {lo}, max {hi}")
    if dup:
        raise ValueError("page_ids has duplicates; each destination page can be written only once")
    return ids


def _launch(src: torch.Tensor, dst: torch.Tensor, ids: torch.Tensor, pack: bool) -> None:
    n = ids.numel()
    if n == 0:
        return
    s, d = _words(src, "source"), _words(dst, "destination")
    words = s.shape[1]
    _copy_pages_kernel.on(src.device)[(n, -(-words // _BLOCK))](
        s, d, ids, words, s.stride(0), d.stride(0), BLOCK=_BLOCK, PACK=pack
    )


def pack_pages(
    pool: torch.Tensor,
    page_ids: torch.Tensor | Sequence[int],
    *,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Copy pool pages `page_ids` (in that order) into a contiguous buffer [n, *pool.shape[1:]] (`out` if given)."""
    ids = _ids(page_ids, pool.shape[0], pool.device, validate, distinct=False)
    shape = (ids.numel(), *pool.shape[1:])
    if out is None:
        out = torch.empty(shape, dtype=pool.dtype, device=pool.device)
    elif tuple(out.shape) != shape or out.dtype != pool.dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {pool.dtype} tensor of shape {shape}, got {tuple(out.shape)} {out.dtype}"
        )
    _launch(pool, out, ids, pack=True)
    return out


def unpack_pages(
    buffer: torch.Tensor, pool: torch.Tensor, page_ids: torch.Tensor | Sequence[int], *, validate: bool = True
) -> None:
    """Copy buffer row i into pool page page_ids[i], in place. page_ids must be distinct (each page written once)."""
    ids = _ids(page_ids, pool.shape[0], pool.device, validate, distinct=True)
    if tuple(buffer.shape) != (ids.numel(), *pool.shape[1:]) or buffer.dtype != pool.dtype:
        raise ValueError(
            f"buffer {tuple(buffer.shape)} {buffer.dtype} must be [{ids.numel()}, "
            f"*{tuple(pool.shape[1:])}] {pool.dtype}: one page per page id"
        )
    _launch(buffer, pool, ids, pack=False)
