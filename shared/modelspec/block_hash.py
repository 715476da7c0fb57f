"""Chained page hashes: the identity of a KV page is the hash of every token up to the end of that page.

    h_0 = H(ROOT_HASH, tokens[0:P]),  h_i = H(h_{i-1}, tokens[i*P:(i+1)*P])

H is blake2b with an 8-byte digest over (parent as 8 little-endian bytes || tokens as little-endian uint32),
read back as an unsigned 64-bit int. It is stable across processes and Python versions (unlike `hash()`), so
the gateway computes the same hashes from token ids as the engines that publish KV events. Only full pages
have a hash. This module imports nothing but the standard library on purpose: the gateway imports it.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

ROOT_HASH = 0  # the "parent" of the first page

_LITTLE = sys.byteorder == "little"


# A media item of a prompt: (offset of its first placeholder token, number of placeholder tokens, media hash).
MediaSpan = tuple[int, int, str]


def page_hash(parent: int, tokens: Sequence[int], extra: bytes = b"") -> int:
    """Hash of one full page whose preceding pages hash to `parent` (ROOT_HASH for the first page).

    extra: what else the page's KV depends on (media_key: the images behind its placeholder tokens); empty for
    text, so text pages hash as they always did.
    """
    buf = array("I", tokens)  # uint32: raises OverflowError for a negative or >= 2**32 token id
    if not _LITTLE:
        buf.byteswap()
    h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(buf.tobytes())
    if extra:
        h.update(extra)
    return int.from_bytes(h.digest(), "little")


def media_key(media: Sequence[MediaSpan], page_start: int, page_size: int) -> bytes:
    """The media a page's placeholder tokens stand for: for each item overlapping [page_start, page_start +
    page_size), its hash and where it starts relative to the page (the placeholders all carry the same token id,
    so the hash is what keeps two images apart, as vLLM's extra keys and SGLang's hash-derived pad ids do)."""
    parts = [
        f"{off - page_start}:{h};".encode()
        for off, n, h in media
        if off < page_start + page_size and off + n > page_start
    ]
    return b"".join(parts)


def page_hashes(
    tokens: Sequence[int],
    page_size: int,
    *,
    parent: int = ROOT_HASH,
    start_page: int = 0,
    media: Sequence[MediaSpan] = (),
) -> list[int]:
    """Hashes of the full pages of `tokens` from page `start_page` on; `parent` is the hash of page start_page-1.

    A trailing partial page has no hash. Example: 40 tokens with page_size 16 -> 2 hashes.
    """
    if page_size <= 0:
        raise ValueError(f"page_size must be positive (got {page_size})")
    out: list[int] = []
    h = parent
    for i in range(start_page, len(tokens) // page_size):
        extra = media_key(media, i * page_size, page_size) if media else b""
        h = page_hash(h, tokens[i * page_size : (i + 1) * page_size], extra)
        out.append(h)
    return out
