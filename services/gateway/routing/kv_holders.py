"""One map for the whole cluster: chained block hash -> the instances whose prefix cache holds that page.

The KV index (kv_index.py) keeps its pages here rather than in a set per instance, so that the routing question
"how many leading pages of this prompt does each instance hold?" is one walk over the prompt's hashes that touches
only the instances holding them, whatever the cluster's size (a set per instance costs a probe per instance per
request: linear in the cluster).

Holders are named by *codes*: an instance's entries carry the code of its current incarnation in the index, and
dropping all of them (a gap, a new epoch, a snapshot replacing them, the instance leaving) retires the code, O(1).
Reads skip retired codes; writes that meet one on their way sweep it out; `compact()` rebuilds the map without them
once they are as many as the live entries, so their memory is reclaimed in amortised O(1) per dropped entry.

Values are kept small: an int for a page held by one instance (the common case under cache-aware routing: each
prefix lives where it was routed), a tuple for a few holders, a set past TUPLE_MAX.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence

TUPLE_MAX = 8  # holders kept in a tuple; more go in a set
COMPACT_MIN = 65_536  # retired entries tolerated before compaction is considered
KEY_BYTES = 32  # a 64-bit hash as a Python int
REF_BYTES = 16  # one more holder of a page: a tuple slot / set slot, amortised

Holders = int | tuple[int, ...] | set[int]


class HolderMap:
    """hash -> holder codes. Not thread-safe."""

    def __init__(self) -> None:
        self._map: dict[int, Holders] = {}
        self._live: set[int] = set()
        self._count: dict[int, int] = {}  # live code -> its entries
        self._codes = itertools.count(1)
        self.refs = 0  # (hash, code) entries stored, retired codes included
        self.live_refs = 0  # of which belong to live codes
        self.compactions = 0

    # ------------------------------------------------------------------ codes

    def new_code(self) -> int:
        code = next(self._codes)
        self._live.add(code)
        self._count[code] = 0
        return code

    def retire(self, code: int) -> None:
        """Drop every entry of `code` (lazily: they stop counting now and are swept later)."""
        if code in self._live:
            self._live.discard(code)
            self.live_refs -= self._count.pop(code)
            self.maybe_compact()

    def count(self, code: int) -> int:
        return self._count.get(code, 0)

    # ------------------------------------------------------------------ updates

    def add(self, code: int, hashes: Iterable[int], room: int | None = None) -> int:
        """Record that `code` holds `hashes`; at most `room` new entries (None: no limit). Returns how many of
        `hashes` were new and did not fit (0 when all fit)."""
        assert code in self._live
        m, live = self._map, self._live
        added = refused = swept = 0
        for h in hashes:
            v = m.get(h)
            if v is None:
                if room is not None and added - swept >= room:
                    refused += 1
                    continue
                m[h] = code
            elif isinstance(v, int):
                if v == code:
                    continue
                if v not in live:  # a retired holder: take its place
                    m[h] = code
                    swept += 1
                else:
                    if room is not None and added - swept >= room:
                        refused += 1
                        continue
                    m[h] = (v, code)
            elif isinstance(v, tuple):
                if code in v:
                    continue
                kept = tuple(c for c in v if c in live)
                if room is not None and added - swept - (len(v) - len(kept)) >= room:
                    refused += 1
                    continue
                swept += len(v) - len(kept)
                m[h] = (set(kept) | {code}) if len(kept) >= TUPLE_MAX else (kept + (code,) if kept else code)
            else:
                if code in v:
                    continue
                if room is not None and added - swept >= room:
                    refused += 1
                    continue
                v.add(code)
            added += 1
        self.refs += added
        self.live_refs += added
        self._count[code] += added
        # A swept entry was replaced by this code's own (counted in added): the retired one is gone.
        self.refs -= swept
        return refused

    def discard(self, code: int, hashes: Iterable[int]) -> None:
        """`code` no longer holds `hashes` (those it does not hold are ignored)."""
        m = self._map
        removed = 0
        for h in hashes:
            v = m.get(h)
            if v is None:
                continue
            if isinstance(v, int):
                if v == code:
                    del m[h]
                    removed += 1
            elif isinstance(v, tuple):
                if code in v:
                    rest = tuple(c for c in v if c != code)
                    m[h] = rest[0] if len(rest) == 1 else rest
                    removed += 1
            elif code in v:
                v.discard(code)
                removed += 1
                if len(v) == 1:
                    m[h] = next(iter(v))
        if code in self._count:
            self._count[code] -= removed
            self.live_refs -= removed
        self.refs -= removed

    def maybe_compact(self) -> bool:
        retired = self.refs - self.live_refs
        if retired > COMPACT_MIN and retired > self.live_refs:
            self.compact()
            return True
        return False

    def compact(self) -> None:
        """Rebuild the map without retired codes: O(entries)."""
        live = self._live
        fresh: dict[int, Holders] = {}
        refs = 0
        for h, v in self._map.items():
            if isinstance(v, int):
                if v in live:
                    fresh[h] = v
                    refs += 1
                continue
            kept = [c for c in v if c in live]
            if not kept:
                continue
            fresh[h] = kept[0] if len(kept) == 1 else (set(kept) if len(kept) > TUPLE_MAX else tuple(kept))
            refs += len(kept)
        self._map = fresh
        self.refs = refs
        self.compactions += 1

    # ------------------------------------------------------------------ queries

    def holds(self, code: int, h: int) -> bool:
        v = self._map.get(h)
        if v is None:
            return False
        return v == code if isinstance(v, int) else code in v

    def overlaps(self, hashes: Sequence[int]) -> dict[int, int]:
        """Live code -> how many of `hashes`, from the first, it holds (codes holding none are left out), in
        order of increasing pages: the deepest holders come last."""
        out: dict[int, int] = {}
        if not hashes:
            return out
        m = self._map
        active = _held(m.get(hashes[0]), self._live)
        depth, n = 1, len(hashes)
        while active and depth < n:
            v = m.get(hashes[depth])
            if len(active) == 1:  # the common case: one instance holds the prefix; no sets per page
                (c,) = active
                if v is None or not (v == c if isinstance(v, int) else c in v):
                    out[c] = depth
                    return out
            else:
                held = _held(v, active)
                for c in active - held:
                    out[c] = depth
                active = held
            depth += 1
        for c in active:
            out[c] = depth
        return out

    def hashes_of(self, code: int) -> set[int]:
        """Every hash `code` holds: a walk of the whole map, for tests and debugging."""
        return {h for h, v in self._map.items() if (v == code if isinstance(v, int) else code in v)}

    def approx_bytes(self) -> int:
        """The map's memory, estimated without walking it (the benchmark checks it against tracemalloc)."""
        return sys.getsizeof(self._map) + KEY_BYTES * len(self._map) + REF_BYTES * max(0, self.refs - len(self._map))

    def __len__(self) -> int:
        return len(self._map)


def _held(v: Holders | None, among: set[int]) -> set[int]:
    """The codes of `v` that are in `among` (set operations in C: no Python loop over the holders)."""
    if v is None:
        return set()
    if isinstance(v, int):
        return {v} if v in among else set()
    return among.intersection(v)
