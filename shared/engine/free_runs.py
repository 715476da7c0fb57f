"""The free pages of a KV pool as a set of maximal runs (first page, length), handed out best-fit.

Why runs: a KV hand-off writes a request's pages from prefill's pool into decode's, and the transfer plan merges
a pair of pages into the previous one when both sides continue it (shared/transfer/plan.py). Pages handed out
in free-list order scatter after a while of churn, so every page becomes its own descriptor (one UCX put, ~6 us
of fixed cost each). Handing a request one contiguous run of pages keeps it one descriptor on both sides.

Policy, for a request of n pages:
1. `near`: when the caller grows a request whose last page is p, a free run starting at p + 1 is taken first
   (chunked prefill and decode growth stay contiguous with what the request already holds);
2. best fit: the shortest run of >= n pages, lowest address among equals (leaves long runs for long requests);
3. no run is long enough: the longest runs first, pieces returned in ascending address order.
Freed pages merge with their free neighbours, so runs are always maximal.

Cost: three indexes over the R free runs (R is the fragmentation, not the pool size): start -> length,
end -> start, and a sorted list of (length, start). An allocation is one bisection plus an O(R) list
insert/delete (a memmove); freeing merges each freed run with its neighbours the same way. No step scans the
pool, so the cost per call does not grow with the number of pages (a 100k-page pool is tested).
"""

from __future__ import annotations

import bisect


class FreeRuns:
    """Free page ids in [lo, hi), kept as maximal runs."""

    def __init__(self, lo: int, hi: int) -> None:
        self._len: dict[int, int] = {}  # run start -> run length
        self._start_of_end: dict[int, int] = {}  # run end (exclusive) -> run start
        self._by_size: list[tuple[int, int]] = []  # (length, start), sorted: best fit is one bisection
        self.num_free = 0
        if hi > lo:
            self._add(lo, hi - lo)
            self.num_free = hi - lo

    @property
    def num_runs(self) -> int:
        return len(self._by_size)

    def runs(self) -> list[tuple[int, int]]:
        """(start, length) of every free run in address order (tests and debugging)."""
        return sorted(self._len.items())

    def take(self, n: int, near: int | None = None) -> list[int]:
        """n free pages (the caller checked n <= num_free), removed from the set; see the module's policy."""
        assert 0 <= n <= self.num_free, f"take({n}) with {self.num_free} free pages"
        out: list[int] = []
        if n and near is not None and near in self._len:
            out.extend(self._cut(near, n))
        left = n - len(out)
        if left:
            i = bisect.bisect_left(self._by_size, (left, -1))
            if i < len(self._by_size):
                out.extend(self._cut(self._by_size[i][1], left))
            else:
                pieces: list[range] = []
                while left:
                    piece = self._cut(self._by_size[-1][1], left)
                    pieces.append(piece)
                    left -= len(piece)
                pieces.sort(key=lambda r: r.start)
                for piece in pieces:
                    out.extend(piece)
        self.num_free -= n
        return out

    def put(self, sorted_ids: list[int]) -> None:
        """Return pages to the set: ascending, unique, none of them free now (PageAllocator's reference counts
        guarantee that; a check here would cost O(R) per call)."""
        i, m = 0, len(sorted_ids)
        while i < m:
            j = i + 1
            while j < m and sorted_ids[j] == sorted_ids[j - 1] + 1:
                j += 1
            start, end = sorted_ids[i], sorted_ids[j - 1] + 1
            if start in self._start_of_end:  # a free run ends where this one starts: merge left
                start = self._start_of_end[start]
                self._remove(start)
            if end in self._len:  # a free run starts where this one ends: merge right
                end += self._remove(end)
            self._add(start, end - start)
            self.num_free += j - i
            i = j

    # ---- the three indexes, always updated together ----------------------------------------------------------
    def _cut(self, start: int, n: int) -> range:
        """The first min(n, length) pages of the run at start; the rest of the run stays free."""
        length = self._remove(start)
        k = min(n, length)
        if length > k:
            self._add(start + k, length - k)
        return range(start, start + k)

    def _add(self, start: int, length: int) -> None:
        self._len[start] = length
        self._start_of_end[start + length] = start
        bisect.insort(self._by_size, (length, start))

    def _remove(self, start: int) -> int:
        length = self._len.pop(start)
        del self._start_of_end[start + length]
        i = bisect.bisect_left(self._by_size, (length, start))
        del self._by_size[i]
        return length
