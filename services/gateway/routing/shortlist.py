"""Which candidates of a large pool the router scores for one request, so that a routing decision costs about the
same with a thousand instances as with eight.

A pool of up to SHORTLIST_MIN candidates is scored whole. Past that, the router scores:

    holders     up to HOLDERS instances of the pool whose exact KV index entry holds most of the prompt (the KV index
                finds them in one walk over the prompt's hashes, whatever the pool's size)
    least       the LEAST candidates that were least loaded when the pool was built (a reported queue of prompt
                tokens, then running requests), kept per pool object: O(pool) once per pool rebuild, not per request
    sample      SAMPLE candidates drawn at random: with `least`, the two choices of "power of two choices" (the most
                loaded instance stays within O(log log n) of the mean, against O(log n / log log n) for one random
                pick), and what spreads a burst that arrives between two pool rebuilds beyond the `least` one

and the policy ranks those (with this gateway's own in-flight work, so a burst does not pile onto `least`).
Candidates excluded for this request, or whose circuit breaker is open, are skipped; if none of the shortlist is
usable the whole pool is scanned, so a shortlist never makes a servable request fail. Four candidates per pool
keep a decision at 1024 instances within ~1.5x of one at 8 (bench/routing_scale.py, bench/RESULTS.md).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from services.gateway.routing.views import Candidate

SHORTLIST_MIN = 16
HOLDERS = 2
LEAST = 1
SAMPLE = 1


@dataclass(frozen=True)
class _PoolIndex:
    by_id: dict[str, Candidate]
    least: tuple[Candidate, ...]
    page_sizes: frozenset[int]


def _load_key(c: Candidate) -> tuple[int, int]:
    return (c.load.queued_prefill_tokens, c.load.running + c.load.queued)


class Shortlist:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(0)
        # per pool name: the candidate tuple it was built from (kept so its id is not reused) and its index
        self._index: dict[str, tuple[tuple[Candidate, ...], _PoolIndex]] = {}

    def index(self, pool: str, cands: tuple[Candidate, ...]) -> _PoolIndex:
        got = self._index.get(pool)
        if got is not None and got[0] is cands:
            return got[1]
        idx = _PoolIndex(
            by_id={c.instance_id: c for c in cands},
            least=tuple(heapq.nsmallest(LEAST, cands, key=_load_key)),
            page_sizes=frozenset(c.page_size for c in cands if c.page_size > 0),
        )
        self._index[pool] = (cands, idx)
        return idx

    def pick(
        self,
        pool: str,
        cands: tuple[Candidate, ...],
        usable: Callable[[Candidate], bool],
        holders: Callable[[int], Mapping[str, int]],
        exclude: Collection[str] = (),
    ) -> list[Candidate]:
        """The candidates to score; `holders(page_size)`: instance id -> leading prompt pages it holds, most
        first."""
        if len(cands) <= SHORTLIST_MIN:
            return [c for c in cands if usable(c)]
        idx = self.index(pool, cands)
        picked: dict[str, Candidate] = {}
        for ps in idx.page_sizes:
            taken = 0
            for iid in holders(ps):  # most pages first: the first few of this pool
                c = idx.by_id.get(iid)
                if c is not None:
                    picked[iid] = c
                    taken += 1
                    if taken == HOLDERS:
                        break
        for c in idx.least:
            picked.setdefault(c.instance_id, c)
        draw, n = self._rng.random, len(cands)
        for _ in range(SAMPLE):  # with replacement: a repeat only makes the shortlist one shorter
            c = cands[int(draw() * n)]
            picked.setdefault(c.instance_id, c)
        out = [c for c in picked.values() if c.instance_id not in exclude and usable(c)]
        return out if out else [c for c in cands if usable(c)]
