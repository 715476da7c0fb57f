"""kv_aware routing with a kvstore in the cluster: a store-held prefix is cheap work, a local hit free."""

from __future__ import annotations

from services.gateway.routing import Candidate, Load, Pools, Router, RouteRequest, make_policy
from services.gateway.routing.kv_index import KVIndex
from services.gateway.routing.policies import STORE_TOKEN_COST
from shared.cluster.bus.kv_events import KVEventBatch, KVOp, KVOpKind
from shared.modelspec.block_hash import page_hashes

PROMPT = tuple(range(3, 3 + 160))  # 10 pages of 16
HASHES = page_hashes(PROMPT, 16)


def _cand(iid: str, queued: int = 0) -> Candidate:
    return Candidate(
        instance_id=iid,
        role="worker",
        grpc_address="127.0.0.1:1",
        epoch=1,
        model="m",
        page_size=16,
        max_running=8,
        load=Load(queued_prefill_tokens=queued, free_pages=100, total_pages=100, known=True),
    )


def _event(iid: str, hashes: list[int], tier: str, seq: int = 1) -> KVEventBatch:
    return KVEventBatch(
        instance_id=iid, epoch=1, seq=seq, ops=(KVOp(KVOpKind.STORED, tuple(hashes)),), page_size=16, tier=tier
    )


def _pick(index: KVIndex, *cands: Candidate) -> str:
    r = Router(make_policy("kv_aware"), kv_index=index)
    return r.plan(RouteRequest("r", PROMPT, 8), Pools(worker=cands)).decode.instance_id


def test_store_pages_count_as_cheap_work_and_local_hits_as_free() -> None:
    index = KVIndex()
    index.apply(_event("w-hot", HASHES[:4], "device"))
    busy_hot, idle = _cand("w-hot", queued=50), _cand("w-idle")
    # without a store: w-hot computes 96 tokens after a queue of 50 (146), w-idle all 160 -> w-hot
    assert _pick(index, busy_hot, idle) == "w-hot"
    # the store holds the whole prompt: w-idle loads it (160 * 0.1 = 16), w-hot waits 50 and loads 96 (59.6)
    index.apply(_event("kvstore-1", HASHES, "host"))
    assert index.store_overlap_pages(HASHES) == 10 and index.overlap_pages("kvstore-1", HASHES) == 10
    assert _pick(index, busy_hot, idle) == "w-idle"
    # equal queues: the local hit wins (free) over loading the same pages from the store (cheap)
    assert _pick(index, _cand("w-hot"), idle) == "w-hot"


def test_a_store_hit_beats_computing() -> None:
    index = KVIndex()
    index.apply(_event("kvstore-1", HASHES[:8], "host"))
    # w-a has a short queue and no cache; w-b has nothing either: both load 8 pages, equal -> the shorter queue
    assert _pick(index, _cand("w-a", queued=10), _cand("w-b", queued=20)) == "w-a"
    # compared with computing: 8 pages from the store cost STORE_TOKEN_COST of 128 tokens
    index2 = KVIndex()
    index2.apply(_event("w-b", HASHES[:2], "device"))
    index2.apply(_event("kvstore-1", HASHES[:8], "host", seq=1))
    # w-b holds 2 pages locally and loads 6; w-a loads 8: w-b cheaper by 2 pages * 16 * STORE_TOKEN_COST
    assert STORE_TOKEN_COST < 1
    assert _pick(index2, _cand("w-a"), _cand("w-b")) == "w-b"
