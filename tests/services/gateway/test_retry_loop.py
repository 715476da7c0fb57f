"""RetryLoop alone: replay state, the retry budget, the verdicts that end a request, the errors of no route; and an
Attempt alone against one in-process fake Decode server: its chunks, its verdict, what the router hears."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.gateway.backend import (
    BackendChunk,
    BackendOverloaded,
    BackendRequest,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    RequestFailed,
)
from services.gateway.backends.attempt import Attempt, AttemptDeps
from services.gateway.backends.retry_loop import RetryLoop
from services.gateway.routing.breaker import BreakerBoard, BreakerConfig, BreakerState
from services.gateway.routing.channels import ChannelPool
from services.gateway.routing.encoders import EncoderRouter
from services.gateway.routing.failures import FailureKind, Verdict
from services.gateway.routing.media_affinity import MediaAffinity
from services.gateway.routing.policies import make_policy
from services.gateway.routing.router import NoRoute, NoRouteReason, Router
from services.gateway.routing.views import Candidate, Mode, RoutePlan
from shared.modelspec.sampling import SamplingParams
from shared.telemetry.tracing import Tracing

PROMPT = (5, 6, 7, 8)


def request(max_tokens: int = 6, n: int = 1) -> BackendRequest:
    return BackendRequest(
        request_id="r1", model="m", prompt_token_ids=PROMPT, sampling=SamplingParams(max_tokens=max_tokens, n=n)
    )


def server_failure(iid: str = "w1") -> Verdict:
    return Verdict(FailureKind.SERVER, f"{iid} crashed", exclude=frozenset({iid}), blame=frozenset({iid}))


def test_replay_continues_after_the_tokens_already_sent() -> None:
    loop = RetryLoop(request(max_tokens=6), retries=2)
    assert loop.first and loop.route_request().prompt_token_ids == PROMPT  # type: ignore[union-attr]
    loop.took(BackendChunk((40, 41)))
    assert not loop.first and not loop.completed
    assert loop.failed(server_failure(), "colocated w1") is True
    nxt = loop.route_request()
    assert nxt is not None and nxt.prompt_token_ids == (*PROMPT, 40, 41) and nxt.max_tokens == 4
    assert loop.exclude == {"w1"} and loop.attempt == 1
    loop.took(BackendChunk((42, 43, 44, 45)))
    assert loop.route_request() is None  # every token went out: the request is over
    final = loop.final_chunk()
    assert final.finish_reason == "length" and loop.completed


def test_the_budget_counts_failures_not_refusals() -> None:
    loop = RetryLoop(request(), retries=1)
    for iid in ("a", "b", "c"):  # refusals: bounded by the instances, not the budget
        v = Verdict(FailureKind.OVERLOADED, "full", exclude=frozenset({iid}))
        assert loop.failed(v, iid) is False
    assert loop.failed(server_failure("d"), "d") is True
    with pytest.raises(BackendUnavailable, match="failed 2 times .* retries 1 times"):
        loop.failed(server_failure("e"), "e")


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        (FailureKind.INVALID, InvalidRequest),
        (FailureKind.NOT_FOUND, ModelNotFound),
        (FailureKind.REQUEST, RequestFailed),
    ],
)
def test_verdicts_that_end_the_request(kind: FailureKind, error: type) -> None:
    loop = RetryLoop(request(), retries=5)
    with pytest.raises(error, match="why"):
        loop.failed(Verdict(kind, "why"), "w1")
    assert loop.attempt == 0 and not loop.exclude


def test_a_broken_stream_of_several_samples_is_not_replayed() -> None:
    loop = RetryLoop(request(n=2), retries=5)
    loop.took(BackendChunk((40,), index=1))
    assert loop.sent == []  # n > 1: nothing to replay from
    with pytest.raises(BackendUnavailable, match="n > 1 streams are not replayed"):
        loop.failed(server_failure(), "w1")


def test_no_route_errors_say_why() -> None:
    loop = RetryLoop(request(), retries=2, retry_after_s=1.0, breaker_cooldown_s=7.0)
    loop.failed(Verdict(FailureKind.OVERLOADED, "queue full", exclude=frozenset({"w1"})), "w1")
    err = loop.no_route(NoRoute("all excluded", NoRouteReason.EXCLUDED))
    assert isinstance(err, BackendOverloaded) and "at capacity (queue full)" in str(err)
    err = loop.no_route(NoRoute("breakers", NoRouteReason.BREAKERS_OPEN))
    assert isinstance(err, BackendUnavailable) and err.retry_after_s == 7.0
    err = loop.no_route(NoRoute("nothing", NoRouteReason.NONE_READY))
    assert isinstance(err, BackendUnavailable) and "no instance serving 'm' is ready" in str(err)


# ---------------------------------------------------------------- one Attempt against a scripted instance


class Scripted(worker_pb2_grpc.DecodeServicer):
    def __init__(self, replies: list[worker_pb2.DecodeResponse]) -> None:
        self.replies = replies

    async def Generate(
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.DecodeResponse]:
        for r in self.replies:
            yield r


async def run_attempt(replies: list[worker_pb2.DecodeResponse]) -> tuple[Attempt, list[BackendChunk], Router]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeServicer_to_server(Scripted(replies), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels = ChannelPool()
    try:
        router = Router(make_policy("kv_aware"), breakers=BreakerBoard(BreakerConfig(failure_threshold=1)))
        worker = Candidate("w1", "worker", f"127.0.0.1:{port}", 1)
        no_encoders = EncoderRouter(None, None)  # type: ignore[arg-type]  # a text-only request never asks it
        deps = AttemptDeps(router, channels, MediaAffinity(no_encoders), Tracing.off())
        loop = RetryLoop(request(max_tokens=3), retries=2)
        attempt = Attempt(deps, loop, RoutePlan(Mode.COLOCATED, worker), 0.0)
        chunks = [c async for c in attempt.run()]
        return attempt, chunks, router
    finally:
        await channels.close()
        await server.stop(None)


def tokens(*ids: int, finish: int = 0) -> worker_pb2.DecodeResponse:
    return worker_pb2.DecodeResponse(request_id="r1", token_ids=list(ids), finish_reason=finish)  # type: ignore[arg-type]


async def test_an_attempt_translates_the_stream_and_completes() -> None:
    attempt, chunks, router = await run_attempt([tokens(40), tokens(41, 42, finish=common_pb2.FINISH_REASON_LENGTH)])
    assert [c.token_ids for c in chunks] == [(40,), (41, 42)] and chunks[-1].finish_reason == "length"
    assert attempt.verdict is None and attempt.loop.completed and attempt.loop.sent == [40, 41, 42]
    assert router.local("w1").inflight == 0  # its lease was released


async def test_an_attempt_that_fails_mid_stream_has_a_verdict_and_blames_the_instance() -> None:
    broken = worker_pb2.DecodeResponse(
        request_id="r1",
        finish_reason=common_pb2.FINISH_REASON_ERROR,
        error=common_pb2.Error(code=common_pb2.ERROR_CODE_INTERNAL, message="step failed", instance_id="w1"),
    )
    attempt, chunks, router = await run_attempt([tokens(40), broken])
    assert [c.token_ids for c in chunks] == [(40,)] and not attempt.loop.completed
    assert attempt.verdict is not None and attempt.verdict.kind == FailureKind.SERVER
    assert attempt.verdict.blame == {"w1"} and attempt.call is None
    assert router.breakers.get("w1").state == BreakerState.OPEN


async def test_an_attempt_whose_stream_ends_without_a_finish_reason_is_a_server_failure() -> None:
    attempt, _, _ = await run_attempt([tokens(40)])
    assert attempt.verdict is not None and "without a finish reason" in attempt.verdict.message
