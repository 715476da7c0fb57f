"""The page allocator's free-run set: ascending contiguous runs, best fit, growth behind a request's last page,
maximal runs after any free order, and a per-call cost that does not grow with the pool."""

from __future__ import annotations

import random
import time

from shared.engine.free_runs import FreeRuns
from shared.engine.page_allocator import PageAllocator


def _runs_of(ids: set[int]) -> list[tuple[int, int]]:
    """Maximal (start, length) runs of a set of ids, in address order: the reference model."""
    out: list[tuple[int, int]] = []
    for p in sorted(ids):
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((p, 1))
    return out


def _num_pieces(pages: list[int]) -> int:
    return 1 + sum(1 for a, b in zip(pages, pages[1:]) if b != a + 1)


def test_fresh_pool_hands_out_ascending_contiguous_pages_after_the_reserved_ones():
    a = PageAllocator(100, num_reserved=1)
    assert a.alloc(5) == [1, 2, 3, 4, 5]
    assert a.alloc(3) == [6, 7, 8]
    assert a.num_free_runs == 1


def test_best_fit_takes_the_shortest_run_that_holds_the_request():
    a = PageAllocator(64)
    blocks = [a.alloc(n) for n in (5, 2, 3, 2, 8, 2)]  # holes of 5, 3 and 8 pages once freed
    for b in (blocks[0], blocks[2], blocks[4]):
        a.decref(b)
    assert a.num_free_runs == 4  # the three holes and the pool's tail
    assert a.alloc(3) == blocks[2]  # exactly fits the 3-page hole, not the front of the 5-page one
    assert a.alloc(4) == blocks[0][:4]  # 5-page hole: the shortest that holds 4
    assert a.alloc(6) == blocks[4][:6]  # 8-page hole before the tail
    assert a.alloc(1) == [blocks[0][4]]  # the 1-page remainder, not a piece of the tail


def test_equal_runs_go_lowest_address_first():
    a = PageAllocator(32)
    blocks = [a.alloc(4) for _ in range(6)]
    a.decref(blocks[3])
    a.decref(blocks[1])
    assert a.alloc(4) == blocks[1]
    assert a.alloc(4) == blocks[3]


def test_without_a_long_enough_run_the_longest_runs_are_used_in_address_order():
    a = PageAllocator(20)
    blocks = [a.alloc(n) for n in (3, 1, 2, 1, 4, 1, 8)]  # the whole pool
    for b in (blocks[0], blocks[2], blocks[4]):
        a.decref(b)
    got = a.alloc(7)  # runs of 3, 2 and 4: the 4 and the 3, in address order
    assert got == blocks[0] + blocks[4]
    assert _num_pieces(got) == 2
    assert a.alloc(2) == blocks[2] and a.num_free == 0


def test_after_continues_a_request_behind_its_last_page():
    a = PageAllocator(64)
    req = a.alloc(4)
    other = a.alloc(2)  # right behind req: growth cannot continue there
    a.decref(other)
    assert a.alloc(3, after=req[-1]) == [4, 5, 6]
    a2 = PageAllocator(64)
    first = a2.alloc(4)
    a2.alloc(4)  # occupies 4..7
    grown = a2.alloc(2, after=first[-1])  # page 4 is taken: best fit elsewhere
    assert grown == [8, 9]
    # a run behind the last page that is too short is taken first, the rest comes from best fit
    a3 = PageAllocator(64)
    r = a3.alloc(2)
    gap = a3.alloc(2)
    a3.alloc(10)
    a3.decref(gap)
    assert a3.alloc(5, after=r[-1]) == [2, 3, 14, 15, 16]


def test_runs_stay_maximal_whatever_the_free_order():
    rng = random.Random(3)
    a = PageAllocator(500, num_reserved=2)
    held = [a.alloc(rng.randint(1, 30)) for _ in range(20)]
    pages = [p for b in held for p in b]
    rng.shuffle(pages)
    for i in range(0, len(pages), 7):
        a.decref(pages[i : i + 7])
    assert a.num_free == 498 and a.num_free_runs == 1
    assert a._free.runs() == [(2, 498)]


def test_random_churn_matches_the_model_and_the_policy():
    """Against a set model: free pages and their runs agree after every call; a request gets one contiguous
    run, the shortest that holds it, whenever one exists; otherwise as few pieces as the longest runs give."""
    rng = random.Random(11)
    n_pages = 400
    a = PageAllocator(n_pages, num_reserved=1)
    free = set(range(1, n_pages))
    live: list[list[int]] = []
    for _ in range(3000):
        if live and (rng.random() < 0.45 or len(free) < 40):
            pages = live.pop(rng.randrange(len(live)))
            assert sorted(a.decref(pages)) == sorted(pages)
            free |= set(pages)
        else:
            n = rng.randint(1, 24)
            after = rng.choice(live)[-1] if live and rng.random() < 0.3 else None
            runs = _runs_of(free)
            got = a.alloc(n, after=after)
            if n > len(free):
                assert got is None
                continue
            assert got is not None and len(got) == n and len(set(got)) == n and set(got) <= free
            if after is None:
                fits = [r for r in runs if r[1] >= n]
                if fits:
                    best = min(fits, key=lambda r: (r[1], r[0]))
                    assert got == list(range(best[0], best[0] + n))
                else:
                    longest = sorted(runs, key=lambda r: (-r[1], r[0]))
                    need, k = n, 0
                    while need > 0:
                        need -= longest[k][1]
                        k += 1
                    assert _num_pieces(got) == k and got == sorted(got)
            elif after + 1 in free:
                assert got[0] == after + 1
            free -= set(got)
            live.append(got)
        assert a._free.runs() == _runs_of(free)
        assert a.num_free == len(free)


def test_free_runs_alone_round_trip():
    f = FreeRuns(10, 20)
    got = f.take(4)
    assert got == [10, 11, 12, 13] and f.num_free == 6
    f.put([11, 12])
    assert f.runs() == [(11, 2), (14, 6)] and f.num_runs == 2
    f.put([10, 13])
    assert f.runs() == [(10, 10)] and f.take(0) == []


def _churn(a: PageAllocator, ops: int, seed: int) -> None:
    """Requests of 1-64 pages allocated, grown a page at a time behind their last page and freed, about ten
    live at a time (a fragmented free set), everything freed at the end; a request that does not fit frees one."""
    rng = random.Random(seed)
    live: list[list[int]] = []
    for _ in range(ops):
        r = rng.random()
        if live and (r < 0.3 or len(live) > 10):
            a.decref(live.pop(rng.randrange(len(live))))
        elif live and r < 0.7:
            req = rng.choice(live)
            got = a.alloc(1, after=req[-1])
            if got is None:
                a.decref(live.pop(rng.randrange(len(live))))
            else:
                req.extend(got)
        else:
            got = a.alloc(rng.randint(1, 64))
            if got is None:
                a.decref(live.pop(rng.randrange(len(live))))
            else:
                live.append(got)
    for req in live:
        a.decref(req)


def test_cost_per_call_does_not_grow_with_the_pool():
    """The same churn on 1k-, 100k- and 1M-page pools. A per-call scan of the pool, even a vectorised one (a numpy
    bitmap search), makes the 1M pool ~50x slower than the 1k one (measured); the runs only depend on
    fragmentation. Best of three per size and a 5x margin, so that load on a shared box cannot fail it."""

    def best_time(a: PageAllocator) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            _churn(a, 2000, seed=5)
            best = min(best, time.perf_counter() - t0)
            assert a.num_free == a.capacity and a.num_free_runs == 1  # everything back, one run again
        return best

    t_1k = best_time(PageAllocator(1_000))
    for pages in (100_000, 1_000_000):
        t = best_time(PageAllocator(pages))
        assert t < 5 * t_1k, f"{pages} pages: {t * 1e3:.1f} ms vs 1k pages: {t_1k * 1e3:.1f} ms"
