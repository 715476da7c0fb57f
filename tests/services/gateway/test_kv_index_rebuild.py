"""KV index rebuilt from snapshots: the holder map, the snapshot-to-live hand-over (checked against the publisher's
own state under random loss and random snapshot timing), the sync's retries, snapshot parts, and routing by load
for entries that are not exact."""

from __future__ import annotations

import asyncio
import random

import pytest

from services.gateway.routing import kv_holders
from services.gateway.routing.kv_holders import TUPLE_MAX, HolderMap
from services.gateway.routing.kv_index import TAIL_GRACE_S, IndexState, KVIndex
from services.gateway.routing.kv_sync import KVIndexSync, index_status
from services.gateway.routing.policies import make_policy
from services.gateway.routing.router import Router
from services.gateway.routing.views import Candidate, Pools, RouteRequest
from shared.cluster.bus import kv_snapshot
from shared.cluster.bus.kv_events import KVEventBatch, KVEventPublisher, KVOp, KVOpKind
from shared.cluster.bus.kv_snapshot import KVSnapshot, KVSnapshotRequest, KVSnapshotServer
from shared.modelspec.block_hash import page_hashes

P = 4
PROMPT = list(range(100, 132))  # 8 pages
HASHES = page_hashes(PROMPT, P)


def ev(seq: int, *ops: KVOp, iid: str = "p1", epoch: int = 1) -> KVEventBatch:
    return KVEventBatch(instance_id=iid, epoch=epoch, seq=seq, ops=ops, page_size=P)


def stored(hashes: list[int]) -> KVOp:
    return KVOp(KVOpKind.STORED, tuple(hashes))


# ---------------------------------------------------------------------------------------------------- holder map


def test_holder_map_overlaps_across_holders_and_retired_codes() -> None:
    m = HolderMap()
    a, b, c = m.new_code(), m.new_code(), m.new_code()
    m.add(a, HASHES[:6])
    m.add(b, HASHES[:2])
    m.add(c, HASHES[1:8])  # no first page: no prefix at all
    assert m.overlaps(HASHES) == {a: 6, b: 2}
    m.discard(a, HASHES[3:4])
    assert m.overlaps(HASHES) == {a: 3, b: 2}
    assert m.count(a) == 5 and m.live_refs == 5 + 2 + 7
    m.retire(b)
    assert m.overlaps(HASHES) == {a: 3} and m.live_refs == 12 and m.refs == 14
    m.compact()
    assert m.refs == 12 and m.hashes_of(a) == set(HASHES[:6]) - {HASHES[3]}


def test_holder_map_promotes_many_holders_to_a_set_and_back() -> None:
    m = HolderMap()
    codes = [m.new_code() for _ in range(TUPLE_MAX + 3)]
    for code in codes:
        m.add(code, HASHES[:2])
    assert m.overlaps(HASHES[:2]) == dict.fromkeys(codes, 2)
    for code in codes[1:]:
        m.discard(code, HASHES[:2])
    assert m.overlaps(HASHES[:2]) == {codes[0]: 2} and m.refs == 2


def test_holder_map_room_and_compaction_of_retired_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_holders, "COMPACT_MIN", 4)
    m = HolderMap()
    a = m.new_code()
    assert m.add(a, HASHES, room=3) == 5 and m.count(a) == 3
    m.retire(a)  # 3 retired entries: not yet worth a compaction
    b = m.new_code()
    m.add(b, [1, 2, 3])
    assert m.refs == 6 and m.compactions == 0
    m.retire(b)  # 6 retired > max(live 0, 4): compacted
    assert m.refs == 0 and m.compactions == 1 and len(m) == 0


# ---------------------------------------------------------------------------------------------------- hand-over


def test_snapshot_then_held_events_make_the_entry_exact() -> None:
    idx = KVIndex()
    idx.apply(ev(5, stored(HASHES[:2])))  # joined late
    assert idx.state("p1") == IndexState.DEGRADED
    assert idx.begin_rebuild("p1")
    idx.apply(ev(8, KVOp(KVOpKind.EVICTED, (HASHES[0],))))  # held back
    idx.apply(ev(7, stored(HASHES[4:6])))  # out of order: held, sorted when applied
    assert idx.state("p1") == IndexState.REBUILDING
    state = idx.load_snapshot(KVSnapshot("p1", 1, 6, P, "device", tuple(HASHES[:4])))
    assert state == IndexState.EXACT and idx.seq("p1") == 8
    assert idx.hashes("p1") == set(HASHES[1:6])


def test_a_gap_between_snapshot_and_held_events_is_caught() -> None:
    idx = KVIndex()
    assert idx.begin_rebuild("p1")  # unknown instance: rebuilt from nothing
    idx.apply(ev(9, stored(HASHES[:1])))
    assert idx.load_snapshot(KVSnapshot("p1", 1, 7, P, "device", tuple(HASHES[:3]))) == IndexState.DEGRADED
    assert idx.stats.gaps == 1 and idx.needing_snapshot() == ["p1"]


def test_a_lost_last_event_is_caught_by_the_load_reports_seq() -> None:
    now = [0.0]
    idx = KVIndex(clock=lambda: now[0])
    idx.apply(ev(1, stored(HASHES)))
    idx.note_published("p1", 1, 2)  # seq 2 is published: maybe still on its way
    now[0] += TAIL_GRACE_S / 2
    idx.apply(ev(2, stored(HASHES[:1])))  # it arrives
    idx.note_published("p1", 1, 3)
    now[0] += TAIL_GRACE_S / 2
    idx.note_published("p1", 1, 3)
    assert idx.state("p1") == IndexState.EXACT  # seq 2 came in time; 3 has had half the grace
    now[0] += TAIL_GRACE_S
    idx.note_published("p1", 1, 3)
    assert idx.state("p1") == IndexState.DEGRADED and [e.reason for e in idx.entries()] == ["tail"]


def test_rebuild_failure_applies_held_events_and_stays_degraded() -> None:
    idx = KVIndex()
    idx.apply(ev(3, stored(HASHES[:1])))
    idx.begin_rebuild("p1")
    idx.apply(ev(4, stored(HASHES[1:2])))
    idx.rebuild_failed("p1")
    assert idx.state("p1") == IndexState.DEGRADED and idx.hashes("p1") == set(HASHES[:2])
    assert [e.reason for e in idx.entries()] == ["no_snapshot"]


def test_a_new_epoch_in_the_held_events_wins_over_an_older_snapshot() -> None:
    idx = KVIndex()
    idx.begin_rebuild("p1")
    idx.apply(ev(1, stored(HASHES[:1]), epoch=2))
    assert idx.load_snapshot(KVSnapshot("p1", 1, 40, P, "device", tuple(HASHES))) == IndexState.EXACT
    assert idx.hashes("p1") == {HASHES[0]}


class _Wire:
    """A fake bus: what the publisher sends, delivered (or lost) when the test says."""

    def __init__(self) -> None:
        self.sent: list[KVEventBatch] = []

    async def publish(self, subject: str, event: KVEventBatch) -> bool:
        self.sent.append(event)
        return True


@pytest.mark.parametrize("seed", range(20))
async def test_random_loss_and_snapshot_timing_never_leave_a_wrong_exact_entry(seed: int) -> None:
    """A real publisher and the index, events lost at random, snapshots taken while ops are still batched and
    delivered late: an exact entry always equals the publisher's state at the entry's sequence number (or, right
    after a snapshot, the snapshot), and a final repair makes it exact and equal."""
    rng = random.Random(seed)
    wire = _Wire()
    pub = KVEventPublisher(wire, "c", "p1", epoch=1, page_size=P, batch_window_s=3600)  # type: ignore[arg-type]
    now = [0.0]
    idx = KVIndex(clock=lambda: now[0])
    truth_at: dict[int, set[int]] = {0: set()}
    universe = list(range(1, 200))
    pending_snap: list[tuple[int, KVSnapshot]] = []
    snap_state: tuple[int, set[int]] | None = None  # (seq, hashes) of the last applied snapshot

    def snapshot() -> KVSnapshot:
        epoch, seq, hashes = pub.snapshot()
        return KVSnapshot("p1", epoch, seq, P, "device", hashes)

    for step in range(600):
        r = rng.random()
        if r < 0.45:
            pub.stored(rng.sample(universe, rng.randint(1, 6)))
        elif r < 0.75:
            pub.evicted(rng.sample(universe, rng.randint(1, 6)))
        elif r < 0.77:
            pub.cleared()
        elif r < 0.9:
            await pub.flush()
            truth_at[pub.snapshot()[1]] = set(pub.snapshot()[2])
        elif r < 0.95 and not pending_snap and idx.begin_rebuild("p1"):  # only a degraded or unknown entry
            pending_snap.append((step + rng.randint(0, 20), snapshot()))
        while wire.sent and rng.random() < 0.7:
            e = wire.sent.pop(0)
            if rng.random() >= 0.05:  # 5% lost
                idx.apply(e)
        if pending_snap and pending_snap[0][0] <= step:
            _, snap = pending_snap.pop()
            idx.load_snapshot(snap)
            snap_state = (snap.seq, set(snap.hashes))
        if idx.state("p1") == IndexState.EXACT:
            held, seq = idx.hashes("p1"), idx.seq("p1")
            assert held == truth_at[seq] or (snap_state is not None and (seq, held) == snap_state), step
    # repair: deliver everything; a lost last event shows when a load report names a later seq; rebuild if needed
    await pub.flush()
    for e in wire.sent:
        idx.apply(e)
    if pending_snap:
        idx.load_snapshot(pending_snap.pop()[1])
    idx.note_published("p1", 1, pub.seq)
    now[0] += TAIL_GRACE_S
    idx.note_published("p1", 1, pub.seq)
    if idx.state("p1") != IndexState.EXACT:
        assert idx.begin_rebuild("p1")
        assert idx.load_snapshot(snapshot()) == IndexState.EXACT
    assert idx.hashes("p1") == set(pub.snapshot()[2])


# ---------------------------------------------------------------------------------------------------- sync


async def test_sync_rebuilds_degraded_entries_and_retries_failures() -> None:
    idx = KVIndex()
    calls: list[str] = []

    async def fetch(iid: str) -> KVSnapshot:
        calls.append(iid)
        if iid == "p2" and calls.count("p2") == 1:
            raise TimeoutError("no reply")
        return KVSnapshot(iid, 1, 10, P, "device", tuple(HASHES[:3]))

    sync = KVIndexSync(idx, fetch, interval_s=0.01, retry_s=0.02)
    sync.want("p1")
    sync.want("p2")
    await sync.start()
    try:
        assert await sync.settle(2.0)
        assert idx.state("p1") == IndexState.EXACT and idx.overlaps(HASHES).pages == {"p1": 3}
        for _ in range(200):  # p2 failed once: retried after its backoff
            if idx.state("p2") == IndexState.EXACT:
                break
            await asyncio.sleep(0.01)
        assert idx.state("p2") == IndexState.EXACT and calls.count("p2") == 2
        idx.apply(ev(12, stored(HASHES[3:4]), iid="p1"))  # a gap: the sync notices and rebuilds again
        for _ in range(200):
            if idx.state("p1") == IndexState.EXACT and calls.count("p1") == 2:
                break
            await asyncio.sleep(0.01)
        assert calls.count("p1") == 2 and sync.stats.failed == 1
        status = index_status(idx, "gw-1")
        assert [(e.instance_id, e.state) for e in status.entries] == [("p1", "exact"), ("p2", "exact")]
    finally:
        await sync.close()


# ---------------------------------------------------------------------------------------------------- snapshot parts


def test_snapshot_server_answers_in_parts_of_one_frozen_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_snapshot, "PART_HASHES", 3)
    now = [0.0]

    class _Pub:
        page_size, tier = P, "device"

        def snapshot(self) -> tuple[int, int, tuple[int, ...]]:
            return 2, 9, tuple(range(7))

    srv = KVSnapshotServer(None, "c", "p1", lambda: _Pub(), lambda: 2, clock=lambda: now[0])  # type: ignore[arg-type]
    first = srv.answer(KVSnapshotRequest())
    assert (first.epoch, first.seq, first.parts, first.hashes) == (2, 9, 3, (0, 1, 2))
    rest = [srv.answer(KVSnapshotRequest(snapshot_id=first.snapshot_id, part=k)).hashes for k in (1, 2)]
    assert rest == [(3, 4, 5), (6,)]
    now[0] = kv_snapshot.KEEP_S + 1
    assert "gone" in srv.answer(KVSnapshotRequest(snapshot_id=first.snapshot_id, part=1)).error
    empty = KVSnapshotServer(None, "c", "p1", lambda: None, lambda: 5).answer(KVSnapshotRequest())  # type: ignore[arg-type]
    assert (empty.epoch, empty.seq, empty.hashes, empty.parts) == (5, 0, (), 1)


# ---------------------------------------------------------------------------------------------------- routing


def _cand(iid: str, queued: int = 0) -> Candidate:
    from services.gateway.routing.views import Load

    return Candidate(iid, "worker", f"{iid}:1", 1, page_size=P, load=Load(queued_prefill_tokens=queued, known=True))


def test_only_exact_entries_earn_prefix_credit() -> None:
    idx = KVIndex()
    idx.apply(ev(1, stored(HASHES), iid="w-a"))
    idx.apply(ev(7, stored(HASHES), iid="w-b"))  # joined late: degraded
    r = Router(make_policy("kv_aware"), kv_index=idx)
    req = RouteRequest("r", tuple(PROMPT), 4)
    # w-b has the shorter queue and (in truth, perhaps) the prefix, but only w-a's entry is exact
    assert r.plan(req, Pools(worker=(_cand("w-a", queued=10), _cand("w-b")))).decode.instance_id == "w-a"
    idx2 = KVIndex()
    idx2.apply(ev(7, stored(HASHES), iid="w-a"))
    r2 = Router(make_policy("kv_aware"), kv_index=idx2)
    assert r2.plan(req, Pools(worker=(_cand("w-a", queued=10), _cand("w-b")))).decode.instance_id == "w-b"


def test_a_large_pool_is_shortlisted_and_still_finds_the_holder() -> None:
    idx = KVIndex()
    cands = tuple(_cand(f"w-{i:04d}", queued=20 + i // 100) for i in range(500))
    idx.apply(ev(1, stored(HASHES), iid="w-0321"))
    r = Router(make_policy("kv_aware"), kv_index=idx)
    plan = r.plan(RouteRequest("r", tuple(PROMPT), 4), Pools(worker=cands))
    assert plan.decode.instance_id == "w-0321" and plan.cached_tokens == len(PROMPT)
    # without a holder: one of the least loaded (w-0000 .. w-0099 are tied)
    plan = r.plan(RouteRequest("r", tuple(range(900, 932)), 4), Pools(worker=cands))
    assert int(plan.decode.instance_id[2:]) < 100
    # every candidate but one excluded: the whole pool is searched
    keep = "w-0444"
    ex = {c.instance_id for c in cands} - {keep}
    assert r.plan(RouteRequest("r", tuple(PROMPT), 4), Pools(worker=cands), exclude=ex).decode.instance_id == keep
