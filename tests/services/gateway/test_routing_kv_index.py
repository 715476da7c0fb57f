"""KV index: prefix overlap from KV events, sequence gaps, epochs, and the chained hashes the engine publishes."""

from __future__ import annotations

from services.gateway.routing.kv_index import IndexState, KVIndex, PromptHashes
from shared.cluster.bus.kv_events import KVEventBatch, KVOp, KVOpKind
from shared.modelspec.block_hash import page_hashes

P = 4  # page size


def ev(seq: int, *ops: KVOp, iid: str = "p1", epoch: int = 1) -> KVEventBatch:
    return KVEventBatch(instance_id=iid, epoch=epoch, seq=seq, ops=ops, page_size=P)


def stored(hashes: list[int]) -> KVOp:
    return KVOp(KVOpKind.STORED, tuple(hashes))


def evicted(hashes: list[int]) -> KVOp:
    return KVOp(KVOpKind.EVICTED, tuple(hashes))


PROMPT = list(range(100, 118))  # 18 tokens: 4 full pages
HASHES = page_hashes(PROMPT, P)


def test_overlap_counts_leading_pages_only() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES[:3])))
    assert idx.overlap_pages("p1", HASHES) == 3
    assert idx.overlap_pages("other", HASHES) == 0
    # A held page after a missing one is no use: the prefix before it would have to be computed anyway.
    idx2 = KVIndex()
    idx2.apply(ev(1, stored([HASHES[0], HASHES[2]])))
    assert idx2.overlap_pages("p1", HASHES) == 1


def test_prompt_with_a_different_first_page_has_no_overlap() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES)))
    other = [999, *PROMPT[1:]]
    assert idx.overlap_pages("p1", page_hashes(other, P)) == 0  # chained: every later page differs too


def test_evicted_and_cleared() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES)))
    idx.apply(ev(2, evicted(HASHES[2:])))
    assert idx.overlap_pages("p1", HASHES) == 2
    idx.apply(ev(3, KVOp(KVOpKind.CLEARED), stored(HASHES[:1])))  # ops apply in order
    assert idx.overlap_pages("p1", HASHES) == 1


def test_sequence_gap_drops_the_instance_then_rebuilds() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES)))
    idx.apply(ev(1, stored(HASHES), iid="p2"))
    # seq 2 of p1 (say, evicting everything) was lost; seq 3 arrives.
    idx.apply(ev(3, stored([12345])))
    assert idx.stats.gaps == 1
    assert idx.overlap_pages("p1", HASHES) == 0, "entries from before the gap must not be trusted"
    assert idx.num_pages("p1") == 1  # what the event after the gap said is kept
    assert idx.overlap_pages("p2", HASHES) == 4, "a gap of one instance leaves the others alone"
    idx.apply(ev(4, stored(HASHES[:2])))
    assert idx.overlap_pages("p1", HASHES) == 2


def test_replayed_and_old_epoch_events_are_ignored() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES), epoch=2))
    idx.apply(ev(1, evicted(HASHES), epoch=2))  # duplicate seq
    idx.apply(ev(5, evicted(HASHES), epoch=1))  # an older incarnation
    assert idx.overlap_pages("p1", HASHES) == 4
    assert idx.stats.stale == 2


def test_new_epoch_starts_from_scratch() -> None:
    idx = KVIndex()
    idx.apply(ev(7, stored(HASHES), epoch=1))
    idx.apply(ev(1, stored(HASHES[:1]), epoch=2))
    assert idx.overlap_pages("p1", HASHES) == 1
    assert idx.stats.gaps == 0


def test_joining_late_is_not_a_gap_but_not_exact_either() -> None:
    idx = KVIndex()
    idx.apply(ev(40, stored(HASHES)))
    idx.apply(ev(41, evicted(HASHES[3:])))
    assert idx.stats.gaps == 0
    assert idx.overlap_pages("p1", HASHES) == 3
    # What came before seq 40 is unknown: routing gives it no credit until a snapshot makes it exact.
    assert idx.state("p1") == IndexState.DEGRADED and idx.needing_snapshot() == ["p1"]
    assert idx.overlaps(HASHES).pages == {}


def test_states_exact_from_seq_1_and_degraded_after_a_gap() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES)))
    assert idx.state("p1") == IndexState.EXACT and idx.overlaps(HASHES).pages == {"p1": 4}
    idx.apply(ev(3, stored(HASHES[:1])))
    assert idx.state("p1") == IndexState.DEGRADED and idx.overlaps(HASHES).pages == {}
    assert [e.reason for e in idx.entries()] == ["gap"]


def test_membership_epoch_and_leave() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES), epoch=3))
    idx.forget_older_than("p1", 3)
    assert idx.overlap_pages("p1", HASHES) == 4
    idx.forget_older_than("p1", 4)
    assert idx.overlap_pages("p1", HASHES) == 0
    idx.apply(ev(1, stored(HASHES), epoch=3))  # late event of the forgotten incarnation
    assert idx.overlap_pages("p1", HASHES) == 0
    idx.apply(ev(1, stored(HASHES), epoch=4))
    idx.remove("p1")
    assert idx.instances() == []


def test_overflow_guard_resets_the_instance() -> None:
    idx = KVIndex(max_hashes_per_instance=3)
    idx.apply(ev(1, stored(HASHES)))
    assert idx.num_pages("p1") == 0 and idx.stats.overflows == 1


def test_prompt_hashes_match_the_engine_and_are_cached() -> None:
    ph = PromptHashes(PROMPT)
    assert ph.for_page_size(P) == HASHES
    assert ph.for_page_size(P) is ph.for_page_size(P)
    assert ph.for_page_size(16) == page_hashes(PROMPT, 16) == [page_hashes(PROMPT, 16)[0]]
    assert ph.for_page_size(0) == []


def test_engine_radix_cache_events_feed_the_index() -> None:
    """The hashes the engine's radix cache reports for a prompt are the ones the gateway computes."""
    from shared.engine.page_allocator import PageAllocator
    from shared.engine.radix_cache import PagesStored, RadixCache

    got: list[PagesStored] = []
    cache = RadixCache(
        PageAllocator(16), P, enabled=True, on_event=lambda e: got.append(e) if isinstance(e, PagesStored) else None
    )
    pages = cache.allocator.alloc(4)
    assert pages is not None
    cache.insert(PROMPT[:16], pages)
    assert got, "the radix cache published no PagesStored event"
    idx = KVIndex()
    idx.apply(ev(1, stored([h for e in got for h in e.hashes])))
    assert idx.overlap_pages("p1", PromptHashes(PROMPT).for_page_size(P)) == 4
