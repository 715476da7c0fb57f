"""Routing policies: round robin rotates, least_load follows load, kv_aware trades prefix overlap for queued work."""

from __future__ import annotations

from collections import Counter

import pytest

from services.gateway.routing import Candidate, Load, Mode, Pools, Router, RouteRequest, make_policy
from shared.cluster.bus.kv_events import KVEventBatch, KVOp, KVOpKind
from shared.modelspec.block_hash import page_hashes

P = 16
PROMPT = tuple(range(1, 1 + 10 * P))  # 10 full pages


def cand(iid: str, role: str = "prefill", **load: int) -> Candidate:
    known = bool(load)
    load.setdefault("total_pages", 1000)
    load.setdefault("free_pages", 1000)
    return Candidate(
        instance_id=iid,
        role=role,
        grpc_address=f"127.0.0.1:{abs(hash(iid)) % 50000 + 1000}",
        epoch=1,
        model="m",
        page_size=P,
        max_running=8,
        load=Load(known=known, **load),
    )


def req(prompt: tuple[int, ...] = PROMPT, max_tokens: int = 16) -> RouteRequest:
    return RouteRequest("r", prompt, max_tokens)


def held(router: Router, iid: str, prompt: tuple[int, ...], pages: int, seq: int = 1) -> None:
    hashes = tuple(page_hashes(prompt, P)[:pages])
    router.kv_index.apply(
        KVEventBatch(instance_id=iid, epoch=1, seq=seq, ops=(KVOp(KVOpKind.STORED, hashes),), page_size=P)
    )


def test_round_robin_spreads_evenly_and_ignores_load() -> None:
    r = Router(make_policy("round_robin"))
    pools = Pools(worker=(cand("w1", "worker", running=7), cand("w2", "worker"), cand("w3", "worker")))
    picks = Counter(r.plan(req(), pools).decode.instance_id for _ in range(30))
    assert picks == {"w1": 10, "w2": 10, "w3": 10}


def test_least_load_picks_the_idle_worker_and_breaks_ties_fairly() -> None:
    r = Router(make_policy("least_load"))
    pools = Pools(
        worker=(cand("w1", "worker", running=5), cand("w2", "worker", running=1), cand("w3", "worker", running=1))
    )
    picks = Counter(r.plan(req(), pools).decode.instance_id for _ in range(10))
    assert picks == {"w2": 5, "w3": 5}


def test_least_load_avoids_a_decode_without_room_for_the_request() -> None:
    r = Router(make_policy("least_load"))
    # d1 is idle but has 5 free pages; the request needs ceil((160 + 16) / 16) = 11.
    pools = Pools(decode=(cand("d1", "decode", free_pages=5), cand("d2", "decode", running=6, free_pages=500)))
    assert r.plan(req(), pools).decode.instance_id == "d2"


def test_least_load_counts_what_this_gateway_sent_since_the_last_report() -> None:
    r = Router(make_policy("least_load"))
    pools = Pools(worker=(cand("w1", "worker"), cand("w2", "worker")))
    leases = [r.begin(r.plan(req(), pools), len(PROMPT)) for _ in range(4)]
    # Reports still say both are idle; local accounting spread the burst.
    assert Counter(lease.plan.decode.instance_id for lease in leases) == {"w1": 2, "w2": 2}
    for lease in leases:
        lease.release()
    assert r.local("w1").inflight == 0 and r.local("w1").inflight_tokens == 0


def test_kv_aware_prefill_prefers_the_instance_holding_the_prefix() -> None:
    r = Router(make_policy("kv_aware"))
    held(r, "p2", PROMPT, pages=8)
    pools = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"), cand("p2"), cand("p3")))
    for _ in range(5):
        plan = r.plan(req(), pools)
        assert plan.mode == Mode.DISAGGREGATED
        assert plan.prefill is not None and plan.prefill.instance_id == "p2"
        assert plan.cached_tokens == 8 * P


def test_kv_aware_trades_overlap_against_queued_prefill_tokens() -> None:
    r = Router(make_policy("kv_aware"))
    held(r, "p2", PROMPT, pages=8)  # saves 128 of 160 tokens on p2
    decode = (cand("d1", "decode"),)
    # p2's queue (100 tokens) + 32 uncached = 132 < p1's 0 + 160: p2 still wins.
    pools = Pools(decode=decode, prefill=(cand("p1"), cand("p2", queued_prefill_tokens=100)))
    assert r.plan(req(), pools).prefill.instance_id == "p2"  # type: ignore[union-attr]
    # A queue of 200 tokens on p2: 232 > 160, so the cold instance is cheaper.
    pools = Pools(decode=decode, prefill=(cand("p1"), cand("p2", queued_prefill_tokens=200)))
    assert r.plan(req(), pools).prefill.instance_id == "p1"  # type: ignore[union-attr]


def test_kv_aware_local_pending_prefill_counts_as_queue() -> None:
    r = Router(make_policy("kv_aware"))
    pools = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"), cand("p2")))
    first = r.plan(req(), pools)
    lease = r.begin(first, len(PROMPT))
    other = tuple(range(5000, 5000 + 10 * P))  # shares nothing with PROMPT
    second = r.plan(req(other), pools)
    assert second.prefill != first.prefill, "a prompt still prefilling on p1 is queued work there"
    lease.first_token()
    assert r.local(first.prefill.instance_id).pending_prefill_tokens == 0  # type: ignore[union-attr]
    lease.release()


def test_kv_aware_credits_a_prefix_the_instance_is_computing_for_an_earlier_request() -> None:
    """Before the first request's KV events arrive, the instance computing a prompt is credited with its pages:
    a second request with the same 10 pages and one more costs 160 queued + 16 uncached there, as much as the
    176 uncached on an idle instance, and the tie goes to the instance that computes less of it (not the prefix a
    second time). After the first token the credit is gone and the KV index speaks."""
    r = Router(make_policy("kv_aware"))
    pools = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"), cand("p2")))
    first = r.plan(req(), pools)
    assert first.prompt_hashes == tuple(page_hashes(PROMPT, P))
    lease = r.begin(first, len(PROMPT))
    follow_up = PROMPT + tuple(range(9000, 9000 + P))  # same 10 pages, one more
    second = r.plan(req(follow_up), pools)
    assert second.prefill == first.prefill and second.cached_tokens == len(PROMPT)
    lease2 = r.begin(second, len(follow_up))
    # Queued work on p1 counts the follow-up's 16 uncached tokens, not its 176.
    assert r.local(first.prefill.instance_id).pending_prefill_tokens == len(PROMPT) + P  # type: ignore[union-attr]
    lease.first_token()
    lease2.first_token()
    assert r.local(first.prefill.instance_id).computing == {}  # type: ignore[union-attr]
    # No KV event ever said p1 holds it (e.g. it evicted at once): no credit is left over.
    assert r.plan(req(follow_up), pools).cached_tokens == 0
    lease.release()
    lease2.release()


def test_kv_aware_credit_of_a_computing_prefix_stops_at_the_first_difference() -> None:
    r = Router(make_policy("kv_aware"))
    pools = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"),))
    lease = r.begin(r.plan(req(), pools), len(PROMPT))
    fork = PROMPT[: 4 * P] + tuple(range(7000, 7000 + 6 * P))  # first 4 pages shared, then different
    assert r.plan(req(fork), pools).cached_tokens == 4 * P
    assert r.plan(req(tuple(range(7000, 7000 + 10 * P))), pools).cached_tokens == 0
    lease.release()
    assert r.plan(req(fork), pools).cached_tokens == 0, "released before its first token: the credit goes too"


def _timed_router() -> tuple[Router, list[float]]:
    now = [0.0]
    return Router(make_policy("kv_aware"), clock=lambda: now[0]), now


def _lease_on(r: Router, pools: Pools, prompt: tuple[int, ...]):
    lease = r.begin(r.plan(req(prompt), pools), len(prompt))
    assert lease.plan.prefill is not None and lease.plan.prefill.instance_id == "p1"
    return lease


def test_queued_work_of_ours_drains_at_the_rate_the_instance_showed() -> None:
    r, now = _timed_router()
    pools = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"),))
    first = _lease_on(r, pools, PROMPT)
    now[0] = 1.0
    first.first_token()  # 160 uncached tokens in 1 s
    cold = [tuple(range(k * 1000, k * 1000 + 10 * P)) for k in (5, 6)]
    leases = [_lease_on(r, pools, prompt) for prompt in cold]  # both start at t=1, served one after the other
    now[0] = 1.5
    loc = r.local("p1")
    assert loc.pending_prefill_tokens == 320
    assert loc.remaining_prefill_tokens(now[0]) == 80 + 160
    now[0] = 2.5
    assert loc.remaining_prefill_tokens(now[0]) == 80
    now[0] = 9.0
    assert loc.remaining_prefill_tokens(now[0]) == 0
    for lease in leases:
        lease.release()  # before a first token: no rate sample, nothing left pending
    assert loc.pending_prefill_tokens == 0 and loc.prefilling == {}
    assert (loc.rate_tokens, loc.rate_seconds) == (160, 1.0)


def test_a_partly_done_prefill_does_not_push_a_prefix_hit_onto_a_cold_instance() -> None:
    """p1 holds 8 of the prompt's 10 pages and is 3/4 through a 160-token prompt of ours: 40 left + 32 uncached
    beats computing all 160 on idle p2. Counting the running prefill whole (160 + 32) sent it to p2."""
    r, now = _timed_router()
    only_p1 = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"),))
    warm = _lease_on(r, only_p1, tuple(range(3000, 3000 + 10 * P)))
    now[0] = 1.0
    warm.first_token()  # p1 computes 160 tokens/s
    warm.release()
    held(r, "p1", PROMPT, pages=8)
    running = _lease_on(r, only_p1, tuple(range(4000, 4000 + 10 * P)))
    pools = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"), cand("p2")))
    now[0] = 1.75
    plan = r.plan(req(), pools)
    assert plan.prefill is not None and plan.prefill.instance_id == "p1" and plan.cached_tokens == 8 * P
    now[0] = 1.05  # just started: 152 left + 32 > 160
    assert r.plan(req(), pools).prefill.instance_id == "p2"  # type: ignore[union-attr]
    running.release()


def test_kv_aware_worker_prefers_prefix_when_idle_and_load_when_busy() -> None:
    r = Router(make_policy("kv_aware"))
    held(r, "w2", PROMPT, pages=10)
    idle = Pools(worker=(cand("w1", "worker"), cand("w2", "worker"), cand("w3", "worker")))
    plan = r.plan(req(), idle)
    assert plan.mode == Mode.COLOCATED and plan.decode.instance_id == "w2" and plan.cached_tokens == len(PROMPT)
    # w2 holds 900 pages of running requests' KV (14400 tokens): far more work than prefilling 160 tokens.
    busy = Pools(worker=(cand("w1", "worker"), cand("w2", "worker", free_pages=100)))
    assert r.plan(req(), busy).decode.instance_id == "w1"


def test_kv_aware_ignores_an_unrelated_prefix() -> None:
    r = Router(make_policy("kv_aware"))
    other = tuple(range(5000, 5000 + 10 * P))
    held(r, "p2", other, pages=10)
    pools = Pools(decode=(cand("d1", "decode"),), prefill=(cand("p1"), cand("p2")))
    picks = Counter(r.plan(req(), pools).prefill.instance_id for _ in range(6))  # type: ignore[union-attr]
    assert picks == {"p1": 3, "p2": 3}


def test_unknown_policy_is_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match="kv_aware, least_load, round_robin"):
        make_policy("random")


def test_kv_aware_decode_prefers_the_decode_holding_the_prefix() -> None:
    """A decode with the prefix cached takes only the rest through the hand-off."""
    r = Router(make_policy("kv_aware"))
    held(r, "d2", PROMPT, pages=10)
    pools = Pools(decode=(cand("d1", "decode"), cand("d2", "decode")), prefill=(cand("p1"),))
    assert {r.plan(req(), pools).decode.instance_id for _ in range(4)} == {"d2"}
    # Load still wins over a small saving: d2 holds 500 pages (8000 tokens) of running requests' KV.
    busy = Pools(decode=(cand("d1", "decode"), cand("d2", "decode", free_pages=500)), prefill=(cand("p1"),))
    assert r.plan(req(), busy).decode.instance_id == "d1"
    # least_load ignores the prefix: the two idle decodes take turns.
    ll = Router(make_policy("least_load"), kv_index=r.kv_index)
    assert Counter(ll.plan(req(), pools).decode.instance_id for _ in range(4)) == {"d1": 2, "d2": 2}
