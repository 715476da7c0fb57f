"""Fixed-size KV pages with reference counts.

A page is referenced by every running request that attends over it and by the radix cache when it holds the
page for reuse; it returns to the free set when the last reference goes. Reference counts are one numpy array
(`_ref[num_pages]`, no Python object per page); the free pages are a set of runs handed out best-fit
(free_runs.py), so a request's pages are one contiguous run whenever the pool has one, and a KV hand-off of them
is one transfer descriptor instead of one per page.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from shared.engine.free_runs import FreeRuns


class PageAllocator:
    """Hands out page ids in [num_reserved, num_pages); ids below num_reserved are never handed out
    (a runner may keep page 0 as a padding/dummy target)."""

    def __init__(self, num_pages: int, *, num_reserved: int = 0) -> None:
        if num_pages <= num_reserved:
            raise ValueError(
                f"num_pages must exceed num_reserved (got num_pages={num_pages}, "
                f"num_reserved={num_reserved}); give the KV pool more memory"
            )
        self.num_pages = num_pages
        self.num_reserved = num_reserved
        self._ref = np.zeros(num_pages, dtype=np.int32)
        self._free = FreeRuns(num_reserved, num_pages)

    @property
    def capacity(self) -> int:
        """Pages that can ever be handed out."""
        return self.num_pages - self.num_reserved

    @property
    def num_free(self) -> int:
        return self._free.num_free

    @property
    def num_used(self) -> int:
        return self.capacity - self._free.num_free

    @property
    def num_free_runs(self) -> int:
        """Contiguous stretches the free pages form (1 = unfragmented)."""
        return self._free.num_runs

    def alloc(self, n: int, *, after: int | None = None) -> list[int] | None:
        """n fresh pages with one reference each, or None (nothing taken) when fewer than n are free.

        One contiguous run when the pool has one of n pages (best fit); `after`: the last page the caller
        already holds for this sequence, so that its growth continues right behind it when that page is free.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages (got {n})")
        if n > self._free.num_free:
            return None
        ids = self._free.take(n, near=None if after is None else after + 1)
        self._ref[ids] = 1
        return ids

    def incref(self, page_ids: Sequence[int] | Iterable[int]) -> None:
        """Add one reference to each page (a page may appear several times); every page must be in use."""
        ids = np.fromiter(page_ids, dtype=np.int64)
        if ids.size == 0:
            return
        assert (self._ref[ids] > 0).all(), f"incref of a free page in {ids[self._ref[ids] <= 0].tolist()}"
        np.add.at(self._ref, ids, 1)

    def decref(self, page_ids: Sequence[int] | Iterable[int]) -> list[int]:
        """Drop one reference from each page; returns the pages that became free."""
        ids = np.fromiter(page_ids, dtype=np.int64)
        if ids.size == 0:
            return []
        np.subtract.at(self._ref, ids, 1)
        ref = self._ref[ids]
        assert (ref >= 0).all(), f"decref of a free page in {ids[ref < 0].tolist()}"
        freed = np.unique(ids[ref == 0]).tolist()  # ascending, as FreeRuns.put needs
        if freed:
            self._free.put(freed)
        return freed

    def refcount(self, page_id: int) -> int:
        return int(self._ref[page_id])

    def refcounts(self) -> np.ndarray:
        """A copy of all reference counts (for tests and debugging dumps)."""
        return self._ref.copy()
