"""Encoder outputs (image embeddings) by media hash: LRU, bounded in items and in bytes.

A hit skips the vision tower. The encoder service keeps one, and so does a colocated worker or a prefill that
runs its own tower. Not thread-safe: one owner (an event loop) touches it.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class EncoderCache:
    def __init__(self, max_items: int = 1024, max_bytes: int = 512 << 20) -> None:
        if max_items < 0 or max_bytes < 0:
            raise ValueError(f"encoder cache limits must be >= 0 (got {max_items} items, {max_bytes} bytes)")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.num_bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, media_hash: str) -> bool:
        return media_hash in self._items

    def get(self, media_hash: str) -> torch.Tensor | None:
        t = self._items.get(media_hash)
        if t is None:
            self.misses += 1
            return None
        self._items.move_to_end(media_hash)
        self.hits += 1
        return t

    def put(self, media_hash: str, value: torch.Tensor) -> None:
        """Keep value (evicting least recently used entries); one larger than the whole budget is not kept."""
        size = value.numel() * value.element_size()
        if self.max_items == 0 or size > self.max_bytes:
            return
        old = self._items.pop(media_hash, None)
        if old is not None:
            self.num_bytes -= old.numel() * old.element_size()
        while self._items and (len(self._items) >= self.max_items or self.num_bytes + size > self.max_bytes):
            _, ev = self._items.popitem(last=False)
            self.num_bytes -= ev.numel() * ev.element_size()
        self._items[media_hash] = value
        self.num_bytes += size
