"""Descriptor arithmetic: coalescing must move exactly the same bytes to exactly the same places."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.transfer.descs import (
    PageDesc,
    RegionHandle,
    coalesce,
    coalesce_pairs,
    describe,
    describe_pages,
    find_region,
)

PAGE = 64


def byte_map(src: list[PageDesc], dst: list[PageDesc]) -> list[tuple[int, int]]:
    """Every (source byte address, destination byte address) a write moves, in order."""
    out = []
    for s, d in zip(src, dst):
        out.extend((s.addr + i, d.addr + i) for i in range(s.length))
    return out


def test_coalesce_merges_adjacent_runs_only() -> None:
    descs = [PageDesc(0, 64), PageDesc(64, 64), PageDesc(256, 64), PageDesc(320, 32), PageDesc(0, 64)]
    assert coalesce(descs) == [PageDesc(0, 128), PageDesc(256, 96), PageDesc(0, 64)]
    assert coalesce([]) == []


def test_coalesce_pairs_needs_both_sides_adjacent() -> None:
    src = [PageDesc(0, 64), PageDesc(64, 64), PageDesc(128, 64), PageDesc(192, 64)]
    dst = [PageDesc(1000, 64), PageDesc(1064, 64), PageDesc(5000, 64), PageDesc(5064, 64)]
    assert coalesce_pairs(src, dst) == (
        [PageDesc(0, 128), PageDesc(128, 128)],
        [PageDesc(1000, 128), PageDesc(5000, 128)],
    )
    # equal keys are required too: pages of two regions that touch in memory stay apart
    assert coalesce_pairs(src[:2], dst[:2], keys=["a", "b"]) == (src[:2], dst[:2])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15)), min_size=1, max_size=24))
def test_coalesce_pairs_preserves_the_byte_mapping(pages: list[tuple[int, int]]) -> None:
    src = [PageDesc(s * PAGE, PAGE) for s, _ in pages]
    dst = [PageDesc(10_000 + d * PAGE, PAGE) for _, d in pages]
    csrc, cdst = coalesce_pairs(src, dst)
    assert byte_map(csrc, cdst) == byte_map(src, dst)
    # nothing left to merge: no pair continues its predecessor on both sides
    for i in range(1, len(csrc)):
        assert not (csrc[i - 1].end == csrc[i].addr and cdst[i - 1].end == cdst[i].addr)


def test_coalesce_pairs_rejects_mismatched_lists() -> None:
    with pytest.raises(ValueError, match="one destination per source"):
        coalesce_pairs([PageDesc(0, 8)], [])
    with pytest.raises(ValueError, match="source length 8 != destination length 4"):
        coalesce_pairs([PageDesc(0, 8)], [PageDesc(0, 4)])


def test_describe_checks_bounds() -> None:
    region = RegionHandle(1, 4096, 4 * PAGE)
    assert describe_pages(region, [3, 0], PAGE) == [PageDesc(4096 + 3 * PAGE, PAGE), PageDesc(4096, PAGE)]
    assert describe(region, [(10, 20)]) == [PageDesc(4106, 20)]
    for bad in [(-1, 8), (0, 0), (4 * PAGE - 8, 16)]:
        with pytest.raises(ValueError, match="outside region 1"):
            describe(region, [bad])
    with pytest.raises(ValueError, match="page_bytes must be > 0"):
        describe_pages(region, [0], 0)


def test_find_region() -> None:
    a, b = RegionHandle(1, 0, 100), RegionHandle(2, 100, 100)
    assert find_region([a, b], PageDesc(100, 100)) == b
    assert find_region([a, b], PageDesc(90, 20)) is None  # straddles both


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15)), min_size=1, max_size=24))
def test_plan_write_coalesces_like_coalesce_pairs(pages: list[tuple[int, int]]) -> None:
    from shared.transfer.plan import plan_write

    # two local regions that touch in memory (pages 0-7 and 8-15): a merged descriptor must not straddle them
    local = [RegionHandle(1, 0, 8 * PAGE), RegionHandle(2, 8 * PAGE, 8 * PAGE)]
    remote = [RegionHandle(-1, 10_000, 16 * PAGE)]
    src = [PageDesc(s * PAGE, PAGE) for s, _ in pages]
    dst = [PageDesc(10_000 + d * PAGE, PAGE) for _, d in pages]
    plan = plan_write(src, dst, local, remote, engine="w", peer="r")
    keys = [s // 8 for s, _ in pages]
    csrc, cdst = coalesce_pairs(src, dst, keys)
    assert [(a, n) for a, n, _ in plan.src.descs] == [(d.addr, d.length) for d in csrc]
    assert [(a, n) for a, n, _ in plan.dst.descs] == [(d.addr, d.length) for d in cdst]
    assert plan.nbytes == len(pages) * PAGE
    assert plan.src_region_ids == {1 + k for k in keys}


def test_plan_write_rejects_out_of_region_pairs() -> None:
    from shared.transfer.errors import RegionError
    from shared.transfer.plan import plan_write

    local, remote = [RegionHandle(1, 0, 4 * PAGE)], [RegionHandle(-1, 1000, 4 * PAGE)]
    ok = PageDesc(0, PAGE)
    with pytest.raises(RegionError, match="source descriptor 1"):
        plan_write([ok, PageDesc(3 * PAGE + 1, PAGE)], [PageDesc(1000, PAGE)] * 2, local, remote, engine="w", peer="r")
    with pytest.raises(RegionError, match="destination descriptor 0 .* peer 'r'"):
        plan_write([ok], [PageDesc(999, PAGE)], local, remote, engine="w", peer="r")
    with pytest.raises(ValueError, match="at least one"):
        plan_write([], [], local, remote, engine="w", peer="r")
