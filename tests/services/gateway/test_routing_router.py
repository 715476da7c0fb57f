"""Pool selection, pair re-choice, breakers in planning, and the verdicts on failed attempts."""

from __future__ import annotations

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2
from services.gateway.routing import (
    BreakerBoard,
    BreakerConfig,
    Candidate,
    Load,
    Mode,
    NoRoute,
    Pools,
    Router,
    RouteRequest,
    make_policy,
)
from services.gateway.routing.failures import FailureKind, classify, classify_stream_end
from services.gateway.routing.views import RoutePlan


def cand(iid: str, role: str) -> Candidate:
    return Candidate(
        instance_id=iid,
        role=role,
        grpc_address="127.0.0.1:1",
        epoch=1,
        model="m",
        page_size=16,
        max_running=8,
        load=Load(),
    )


REQ = RouteRequest("r", tuple(range(40)), 8)
D1, D2 = cand("d1", "decode"), cand("d2", "decode")
P1, P2 = cand("p1", "prefill"), cand("p2", "prefill")
W1 = cand("w1", "worker")


def router(threshold: int = 1) -> Router:
    return Router(make_policy("round_robin"), breakers=BreakerBoard(BreakerConfig(failure_threshold=threshold)))


def test_mode_follows_the_ready_pools() -> None:
    r = router()
    plan = r.plan(REQ, Pools(decode=(D1,), prefill=(P1,), worker=(W1,)))
    assert plan.mode == Mode.DISAGGREGATED and plan.decode == D1 and plan.prefill == P1
    plan = r.plan(REQ, Pools(worker=(W1,), prefill=(P1,)))
    assert plan.mode == Mode.COLOCATED and plan.decode == W1 and plan.prefill is None
    plan = r.plan(REQ, Pools(decode=(D1,)))
    assert plan.mode == Mode.DECODE_LOCAL and plan.decode == D1 and plan.prefill is None


def test_nothing_servable() -> None:
    r = router()
    for pools in (Pools(), Pools(prefill=(P1,))):
        with pytest.raises(NoRoute) as e:
            r.plan(REQ, pools)
        assert e.value.reason == "none_ready"
    assert not Pools(prefill=(P1,)).servable and Pools(decode=(D1,)).servable


def test_pair_rechoice_keeps_a_healthy_decode_and_swaps_the_prefill() -> None:
    r = router()
    pools = Pools(decode=(D1,), prefill=(P1, P2))
    first = r.plan(REQ, pools)
    assert first.prefill is not None
    again = r.plan(REQ, pools, exclude={first.prefill.instance_id})
    assert again.decode == D1 and again.prefill is not None and again.prefill != first.prefill
    # Every prefill refused: the decode prefills locally rather than failing the request.
    last = r.plan(REQ, pools, exclude={"p1", "p2"})
    assert last.mode == Mode.DECODE_LOCAL and last.decode == D1


def test_open_breaker_takes_an_instance_out_until_half_open() -> None:
    clock = [0.0]
    r = Router(
        make_policy("round_robin"),
        breakers=BreakerBoard(BreakerConfig(failure_threshold=1, cooldown_s=5.0), clock=lambda: clock[0]),
    )
    pools = Pools(worker=(W1, cand("w2", "worker")))
    r.failed({"w1"}, {"w1"})
    assert {r.plan(REQ, pools).decode.instance_id for _ in range(4)} == {"w2"}
    clock[0] = 5.0  # half-open: one probe
    probes = [r.plan(REQ, pools) for _ in range(4)]
    assert [p.decode.instance_id for p in probes].count("w1") >= 1
    lease = r.begin(next(p for p in probes if p.decode.instance_id == "w1"), 40)
    assert {r.plan(REQ, pools).decode.instance_id for _ in range(4)} == {"w2"}, "one probe at a time"
    r.succeeded({"w1"})
    lease.release()
    assert "w1" in {r.plan(REQ, pools).decode.instance_id for _ in range(4)}


def test_all_breakers_open_or_all_excluded() -> None:
    r = router()
    pools = Pools(worker=(W1,), decode=(D1,))
    r.failed({"w1", "d1"}, {"w1", "d1"})
    with pytest.raises(NoRoute) as e:
        r.plan(REQ, pools)
    assert e.value.reason == "breakers_open"
    r2 = router()
    with pytest.raises(NoRoute) as e:
        r2.plan(REQ, pools, exclude={"w1", "d1"})
    assert e.value.reason == "excluded"


def test_failed_only_charges_the_blamed_instance() -> None:
    r = router(threshold=1)
    r.failed(blame={"p1"}, involved={"d1", "p1"})
    assert r.breakers.allows("d1") and not r.breakers.allows("p1")


def test_forget_drops_breaker_and_kv_state() -> None:
    r = router()
    r.failed({"w1"}, {"w1"})
    r.forget("w1")
    assert r.breakers.allows("w1")


# ---------------------------------------------------------------- verdicts

PAIR = RoutePlan(Mode.DISAGGREGATED, D1, P1)
SOLO = RoutePlan(Mode.COLOCATED, W1)
E = common_pb2


def err(code: int, iid: str = "") -> common_pb2.Error:
    return common_pb2.Error(code=code, message=f"code {code}", instance_id=iid)


def test_bad_requests_are_not_retried_and_blame_nobody() -> None:
    for v in (
        classify(grpc.StatusCode.INVALID_ARGUMENT, None, SOLO),
        classify(grpc.StatusCode.INVALID_ARGUMENT, err(E.ERROR_CODE_INVALID_ARGUMENT, "w1"), SOLO),
    ):
        assert v.kind == FailureKind.INVALID and not v.retryable and not v.blame
    v = classify(grpc.StatusCode.NOT_FOUND, err(E.ERROR_CODE_NOT_FOUND, "w1"), SOLO)
    assert v.kind == FailureKind.NOT_FOUND and not v.retryable


def test_a_request_that_failed_alone_is_not_retried_and_blames_nobody() -> None:
    """REQUEST_FAILED: the request's own processing failed on a healthy instance, before or after its first token,
    on a worker, a decode or (before the first token) the pair's prefill: no retry, no breaker, no exclusion."""
    for plan, who, started in ((SOLO, "w1", False), (SOLO, "w1", True), (PAIR, "p1", False), (PAIR, "d1", True)):
        v = classify(grpc.StatusCode.INTERNAL, err(E.ERROR_CODE_REQUEST_FAILED, who), plan, started=started)
        assert v.kind == FailureKind.REQUEST and not v.retryable and not v.blame and not v.exclude, (who, started)


def test_connection_failures_blame_the_instance_called() -> None:
    for status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        v = classify(status, None, PAIR)
        assert v.kind == FailureKind.SERVER and v.blame == {"d1"} and v.exclude == {"d1"} and v.uses_retry_budget
    v = classify_stream_end(SOLO)
    assert v.kind == FailureKind.SERVER and v.blame == {"w1"}


def test_overload_and_draining_exclude_without_blame_or_budget() -> None:
    v = classify(grpc.StatusCode.RESOURCE_EXHAUSTED, err(E.ERROR_CODE_OVERLOADED, "w1"), SOLO)
    assert v.kind == FailureKind.OVERLOADED and v.exclude == {"w1"} and not v.blame and not v.uses_retry_budget
    v = classify(grpc.StatusCode.RESOURCE_EXHAUSTED, None, SOLO)
    assert v.kind == FailureKind.OVERLOADED and v.exclude == {"w1"}
    v = classify(grpc.StatusCode.UNAVAILABLE, err(E.ERROR_CODE_DRAINING, "d1"), PAIR)
    assert v.kind == FailureKind.DRAINING and v.exclude == {"d1"} and not v.blame


def test_handoff_failures_rechoose_the_prefill() -> None:
    for code in (E.ERROR_CODE_TRANSFER_FAILED, E.ERROR_CODE_STALE_EPOCH, E.ERROR_CODE_UNAVAILABLE):
        v = classify(grpc.StatusCode.ABORTED, err(code, "d1"), PAIR)
        assert v.kind == FailureKind.HANDOFF and v.exclude == {"p1"} and not v.blame, code
    # The prefill itself says it failed internally: its breaker hears about it.
    v = classify(grpc.StatusCode.INTERNAL, err(E.ERROR_CODE_INTERNAL, "p1"), PAIR)
    assert v.kind == FailureKind.HANDOFF and v.blame == {"p1"}
    # After tokens flowed, the hand-off is over: an INTERNAL error is the decode's.
    v = classify(grpc.StatusCode.INTERNAL, err(E.ERROR_CODE_INTERNAL, "d1"), PAIR, started=True)
    assert v.kind == FailureKind.SERVER and v.blame == {"d1"}
