from __future__ import annotations

import random

import pytest
import torch

from shared.engine.page_allocator import PageAllocator


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_alloc_until_short_then_free_returns_pages():
    a = PageAllocator(8)
    got = a.alloc(5)
    assert got is not None and len(set(got)) == 5 and a.num_free == 3 and a.num_used == 5
    assert a.alloc(4) is None and a.num_free == 3  # nothing taken when short
    assert sorted(a.decref(got[:2])) == sorted(got[:2])
    assert a.num_free == 5
    assert a.alloc(0) == []


def test_reserved_pages_are_never_handed_out():
    a = PageAllocator(6, num_reserved=2)
    assert a.capacity == 4
    got = a.alloc(4)
    assert got is not None and min(got) >= 2
    assert a.alloc(1) is None


def test_refcounts_free_only_at_zero_and_handle_duplicates():
    a = PageAllocator(4)
    p = a.alloc(2)
    assert p is not None
    a.incref([p[0], p[0]])
    assert a.refcount(p[0]) == 3
    assert a.decref([p[0], p[0], p[1]]) == [p[1]]
    assert a.refcount(p[0]) == 1 and a.num_free == 3
    assert a.decref([p[0]]) == [p[0]]


def test_decref_of_free_page_is_an_error():
    a = PageAllocator(4)
    p = a.alloc(1)
    a.decref(p)
    with pytest.raises(AssertionError):
        a.decref(p)
    with pytest.raises(AssertionError):
        a.incref(p)


def test_bad_sizes_name_the_value():
    with pytest.raises(ValueError, match="num_pages"):
        PageAllocator(2, num_reserved=2)
    with pytest.raises(ValueError, match="-1"):
        PageAllocator(2).alloc(-1)


def test_random_ops_match_a_reference_model():
    rng = random.Random(7)
    a = PageAllocator(64, num_reserved=1)
    ref: dict[int, int] = {}  # page -> refcount, the model
    for _ in range(3000):
        op = rng.random()
        if op < 0.4:
            n = rng.randint(0, 10)
            got = a.alloc(n)
            if n > 63 - len(ref):
                assert got is None
                continue
            assert got is not None and len(got) == n
            assert not set(got) & set(ref) and all(1 <= p < 64 for p in got)
            ref.update({p: 1 for p in got})
        elif op < 0.6 and ref:
            ps = rng.sample(sorted(ref), min(len(ref), rng.randint(1, 4)))
            a.incref(ps)
            for p in ps:
                ref[p] += 1
        elif ref:
            ps = rng.sample(sorted(ref), min(len(ref), rng.randint(1, 6)))
            freed = a.decref(ps)
            expect = []
            for p in ps:
                ref[p] -= 1
                if ref[p] == 0:
                    del ref[p]
                    expect.append(p)
            assert sorted(freed) == sorted(expect)
        assert a.num_used == len(ref) and a.num_free == 63 - len(ref)
        counts = a.refcounts()
        assert all(counts[p] == c for p, c in ref.items())
        assert int(counts.sum()) == sum(ref.values())
