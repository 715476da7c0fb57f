from __future__ import annotations

import hashlib
import random
import struct

import pytest
import torch

from shared.engine.page_allocator import PageAllocator
from shared.engine.radix_cache import AllPagesCleared, PagesEvicted, PagesStored, RadixCache
from shared.modelspec.block_hash import ROOT_HASH, page_hash, page_hashes

P = 4


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _independent_hash(parent: int, toks: list[int]) -> int:
    data = struct.pack("<Q", parent) + struct.pack(f"<{len(toks)}I", *toks)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def test_page_hashes_are_chained_and_match_the_documented_formula():
    toks = list(range(100, 111))  # 2 full pages of 4 + 3 leftover tokens
    hs = page_hashes(toks, P)
    h0 = _independent_hash(ROOT_HASH, toks[0:4])
    h1 = _independent_hash(h0, toks[4:8])
    assert hs == [h0, h1]
    assert page_hashes(toks, P, parent=h0, start_page=1) == [h1]
    # a change in page 0 changes every later hash (the chain covers all earlier tokens)
    assert page_hashes([101] + toks[1:], P)[1] != h1
    with pytest.raises(OverflowError):
        page_hash(ROOT_HASH, [-1])


def _cache(num_pages=16, **kw):
    a = PageAllocator(num_pages)
    events: list = []
    return a, RadixCache(a, P, on_event=events.append, **kw), events


def _insert_new(a: PageAllocator, c: RadixCache, toks: list[int]) -> list[int]:
    """What a finishing request does: its own pages go into the cache, then it drops its references."""
    pages = a.alloc(len(toks) // P)
    res = c.insert(toks, pages)
    a.decref(pages)
    return list(res.page_ids)


def test_match_finds_longest_full_page_prefix():
    a, c, events = _cache()
    toks = list(range(10))  # 2 full pages + 2 tokens: only full pages are cached
    pages = _insert_new(a, c, toks)
    assert c.num_pages == 2 and a.num_used == 2
    m = c.match(toks + [99])
    assert m.page_ids == tuple(pages) and m.num_tokens(P) == 8 and m.hashes == tuple(page_hashes(toks, P))
    m2 = c.match(toks[:4] + [77, 5, 6, 7, 8])  # diverges inside page 1
    assert m2.page_ids == (pages[0],)
    assert c.match([1, 2, 3]).num_pages == 0  # less than a page
    assert events == [PagesStored(tuple(page_hashes(toks, P)), None, P, tuple(toks[:8]))]


def test_insert_keeps_existing_pages_and_reports_only_new_ones():
    a, c, events = _cache()
    base = list(range(8))
    _insert_new(a, c, base)
    longer = base + [50, 51, 52, 53]
    mine = a.alloc(3)
    res = c.insert(longer, mine)
    assert res.num_new == 1 and res.page_ids[:2] != tuple(mine[:2]) and res.page_ids[2] == mine[2]
    hs = page_hashes(longer, P)
    assert events[-1] == PagesStored((hs[2],), hs[1], P, (50, 51, 52, 53))
    a.decref(mine)  # the duplicates mine[0:2] are freed, mine[2] stays with the cache
    assert a.num_used == 3 and a.refcount(mine[2]) == 1


def test_locked_pages_survive_eviction_and_lru_order_is_respected():
    a, c, events = _cache()
    old = _insert_new(a, c, [1, 1, 1, 1])
    mid = _insert_new(a, c, [2, 2, 2, 2])
    new = _insert_new(a, c, [3, 3, 3, 3])
    c.match([1, 1, 1, 1])  # touch: now "old" is the most recently used
    m = c.match([2, 2, 2, 2])
    c.lock(m.hashes)
    assert c.num_evictable == 2
    assert c.evict(1) == 1 and a.refcount(new[0]) == 0  # least recently used, unlocked
    assert c.evict(5) == 1 and a.refcount(old[0]) == 0  # the locked one stays
    assert a.refcount(mid[0]) == 1 and c.num_pages == 1
    c.unlock(m.hashes)
    assert c.evict(5) == 1 and a.num_used == 0
    evicted = [h for e in events if isinstance(e, PagesEvicted) for h in e.hashes]
    assert len(evicted) == 3 and len(set(evicted)) == 3


def test_eviction_takes_leaves_before_their_parents():
    a, c, _ = _cache()
    toks = list(range(12))
    pages = _insert_new(a, c, toks)
    c.match(toks[:4])  # touch the root page last: its children are still evicted first
    assert c.evict(1) == 1 and a.refcount(pages[2]) == 0 and a.refcount(pages[0]) == 1
    assert c.match(toks).num_pages == 2
    c.check_invariants()


def test_locking_a_path_protects_the_ancestors():
    a, c, _ = _cache()
    toks = list(range(12))
    _insert_new(a, c, toks)
    _insert_new(a, c, toks[:4] + [9, 9, 9, 9])  # sibling branch under page 0
    m = c.match(toks)
    c.lock(m.hashes)
    assert c.evict(10) == 1  # only the unlocked sibling leaf
    assert c.match(toks).num_pages == 3
    c.unlock(m.hashes)
    c.check_invariants()


def test_disabled_cache_stores_nothing():
    a, c, events = _cache(enabled=False)
    pages = a.alloc(2)
    assert c.insert(list(range(8)), pages).num_new == 0
    assert c.match(list(range(8))).num_pages == 0 and events == [] and a.refcount(pages[0]) == 1


def test_reset_frees_unlocked_pages_and_says_so():
    a, c, events = _cache()
    _insert_new(a, c, list(range(8)))
    assert c.reset() == 2 and a.num_used == 0 and isinstance(events[-1], AllPagesCleared)


def test_random_workload_keeps_invariants():
    rng = random.Random(3)
    a, c, _ = _cache(num_pages=40)
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(4)]
    held: list[tuple[tuple[int, ...], list[int]]] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            hashes, pages = held.pop(rng.randrange(len(held)))
            c.unlock(hashes)
            a.decref(pages)
        else:
            toks = rng.choice(prefixes)[: rng.choice([4, 8])] + [rng.randrange(50) for _ in range(rng.randrange(9))]
            m = c.match(toks)
            c.lock(m.hashes)
            a.incref(m.page_ids)
            need = len(toks) // P - m.num_pages
            if need > a.num_free:
                c.evict(need - a.num_free)
            new = a.alloc(need)
            if new is None:
                c.unlock(m.hashes)
                a.decref(m.page_ids)
                continue
            pages = list(m.page_ids) + new
            res = c.insert(toks, pages, start_page=m.num_pages, hashes=m.hashes)
            c.lock(res.hashes[m.num_pages :])
            held.append((res.hashes, pages))
        c.check_invariants()
    for hashes, pages in held:
        c.unlock(hashes)
        a.decref(pages)
    # nothing is referenced but the cache, and the cache can give everything back
    assert a.num_used == c.num_pages == c.num_evictable
    c.evict(c.num_pages)
    assert a.num_used == 0
