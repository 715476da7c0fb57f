"""GrpcBackend against in-process fake Decode servers: streaming, replay after a crash, refusals, breakers, pairs,
disconnects. The fakes "generate" with a deterministic function of the whole context, so a replayed stream must
reproduce an unbroken run token for token (as greedy decoding does), and a wrong replay prompt shows at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.gateway.backend import (
    BackendChunk,
    BackendOverloaded,
    BackendRequest,
    BackendUnavailable,
    InvalidRequest,
)
from services.gateway.backends.grpc_backend import GrpcBackend
from services.gateway.routing.breaker import BreakerConfig
from shared.cluster.bus.cancel import Cancel
from shared.cluster.grpc_errors import abort
from shared.cluster.instance import Capacity, InstanceInfo, InstanceState
from shared.cluster.membership import EventKind, MembershipEvent
from shared.modelspec.sampling import SamplingParams

MODEL = "m"
PROMPT = tuple(range(3, 40))


def next_token(context: list[int]) -> int:
    """The fake model: a deterministic function of every token so far."""
    return (sum(t * (i + 1) for i, t in enumerate(context)) * 2654435761) % 997 + 5


def reference(prompt: tuple[int, ...], n: int) -> list[int]:
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(next_token(ctx))
    return ctx[len(prompt) :]


# ---------------------------------------------------------------- fake decode instances


@dataclass
class Behaviour:
    """What a fake instance does with the requests it gets (per instance, changed by tests)."""

    refuse: int = 0  # a pdrelay ErrorCode to abort every request with (0: serve)
    crash_after: int | None = None  # stop the whole server after streaming this many tokens (a killed process)
    error_after: int | None = None  # end the stream with an INTERNAL error message after this many tokens
    token_delay_s: float = 0.0
    refuse_if_prefill: str = ""  # answer TRANSFER_FAILED when the request names this prefill instance
    linger_s: float = 0.0  # keep the stream open this long after the last message


@dataclass
class FakeDecode(worker_pb2_grpc.DecodeServicer):
    iid: str
    behaviour: Behaviour = field(default_factory=Behaviour)
    requests: list[worker_pb2.DecodeRequest] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    server: grpc.aio.Server | None = None
    port: int = 0

    async def Generate(
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.DecodeResponse]:
        self.requests.append(request)
        b = self.behaviour
        if b.refuse:
            await abort(context, b.refuse, f"{self.iid} refuses ({b.refuse})", instance_id=self.iid)
        if b.refuse_if_prefill and request.prefill.instance_id == b.refuse_if_prefill:
            await abort(
                context,
                common_pb2.ERROR_CODE_TRANSFER_FAILED,
                f"hand-off from {request.prefill.instance_id} failed",
                instance_id=self.iid,
            )
        ctx = list(request.prompt_token_ids)
        max_tokens = request.sampling.max_tokens if request.sampling.HasField("max_tokens") else 50
        try:
            for i in range(max_tokens):
                if b.crash_after is not None and i == b.crash_after:
                    assert self.server is not None
                    asyncio.ensure_future(self.server.stop(None))  # every connection dies, like SIGKILL
                    await asyncio.sleep(10)
                if b.error_after is not None and i == b.error_after:
                    yield worker_pb2.DecodeResponse(
                        request_id=request.request_id,
                        finish_reason=common_pb2.FINISH_REASON_ERROR,
                        error=common_pb2.Error(
                            code=common_pb2.ERROR_CODE_INTERNAL,
                            message="step failed",
                            instance_id=self.iid,
                            retryable=True,
                        ),
                    )
                    return
                if b.token_delay_s:
                    await asyncio.sleep(b.token_delay_s)
                tok = next_token(ctx)
                ctx.append(tok)
                last = i == max_tokens - 1
                msg = worker_pb2.DecodeResponse(request_id=request.request_id, token_ids=[tok])
                if request.sampling.logprobs:
                    msg.logprobs.append(common_pb2.TokenLogprob(token_id=tok, logprob=-0.5))
                if last:
                    msg.finish_reason = common_pb2.FINISH_REASON_LENGTH
                    msg.usage.CopyFrom(
                        common_pb2.Usage(
                            prompt_tokens=len(request.prompt_token_ids), completion_tokens=max_tokens, cached_tokens=16
                        )
                    )
                yield msg
            if b.linger_s:
                await asyncio.sleep(b.linger_s)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


class FakeMembership:
    """The slice of shared.cluster.membership.Membership the router reads."""

    def __init__(self) -> None:
        self.infos: dict[str, InstanceInfo] = {}
        self._callbacks: list[Callable[[MembershipEvent], object]] = []
        self.stale = False

    def add(self, info: InstanceInfo) -> None:
        self.infos[info.instance_id] = info

    def leave(self, iid: str) -> None:
        info = self.infos.pop(iid)
        for cb in self._callbacks:
            cb(MembershipEvent(EventKind.LEAVE, info))

    def instances(self, role: str | None = None) -> list[InstanceInfo]:
        return sorted((i for i in self.infos.values() if role is None or i.role == role), key=lambda i: i.instance_id)

    def ready(self, role: str | None = None) -> list[InstanceInfo]:
        return [i for i in self.instances(role) if i.state == InstanceState.READY]

    def on_event(self, cb: Callable[[MembershipEvent], object]) -> Callable[[], None]:
        self._callbacks.append(cb)
        return lambda: self._callbacks.remove(cb)


class FakeBus:
    """Records publishes; subscriptions (loads, KV events) never deliver anything."""

    class _Sub:
        async def unsubscribe(self) -> None:
            pass

    def __init__(self) -> None:
        self.published: list[tuple[str, object]] = []
        self.subjects: list[str] = []

    async def publish(self, subject: str, msg: object, **kw: object) -> bool:
        self.published.append((subject, msg))
        return True

    async def subscribe(self, subject: str, msg_type: type, handler: object, **kw: object) -> FakeBus._Sub:
        self.subjects.append(subject)
        return FakeBus._Sub()


class Cluster:
    def __init__(self) -> None:
        self.membership = FakeMembership()
        self.fakes: dict[str, FakeDecode] = {}

    async def add(self, iid: str, role: str = "worker", **behaviour: object) -> FakeDecode:
        fake = FakeDecode(iid, Behaviour(**behaviour))  # type: ignore[arg-type]
        server = grpc.aio.server()
        worker_pb2_grpc.add_DecodeServicer_to_server(fake, server)
        fake.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        fake.server = server
        self.fakes[iid] = fake
        self.membership.add(
            InstanceInfo(
                cluster="t",
                role=role,
                instance_id=iid,
                grpc_address=f"127.0.0.1:{fake.port}",
                epoch=1,
                state=InstanceState.READY,
                model=MODEL,
                capacity=Capacity(max_running_requests=8, num_pages=1000, page_size=16),
            )
        )
        return fake

    async def close(self) -> None:
        for fake in self.fakes.values():
            assert fake.server is not None
            await fake.server.stop(None)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        await c.close()


def backend_for(
    c: Cluster, *, policy: str = "round_robin", retries: int = 2, threshold: int = 3, bus: FakeBus | None = None
) -> GrpcBackend:
    return GrpcBackend.create(
        c.membership,
        models=[MODEL],
        policy=policy,
        request_retries=retries,
        bus=bus,
        cluster="t" if bus is not None else "",  # type: ignore[arg-type]
        breaker=BreakerConfig(failure_threshold=threshold, cooldown_s=30.0),
    )


def request(max_tokens: int = 12, rid: str = "req-1", logprobs: int | None = None) -> BackendRequest:
    return BackendRequest(
        request_id=rid,
        model=MODEL,
        prompt_token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs),
    )


async def collect(backend: GrpcBackend, req: BackendRequest) -> list[BackendChunk]:
    return [c async for c in backend.generate(req)]


def tokens(chunks: list[BackendChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


# ---------------------------------------------------------------- tests


async def test_streams_one_chunk_per_message_with_usage(cluster: Cluster) -> None:
    fake = await cluster.add("w1")
    backend = backend_for(cluster)
    await backend.start()
    chunks = await collect(backend, request(max_tokens=6, logprobs=0))
    assert tokens(chunks) == reference(PROMPT, 6)
    assert [c.finish_reason for c in chunks] == [None] * 5 + ["length"]
    assert chunks[0].num_prompt_tokens == len(PROMPT) and chunks[-1].num_cached_tokens == 16
    assert chunks[0].logprobs is not None and chunks[0].logprobs[0].logprob == -0.5
    sent = fake.requests[0]
    assert list(sent.prompt_token_ids) == list(PROMPT) and sent.sampling.max_tokens == 6 and sent.attempt == 0
    assert not sent.HasField("prefill") and sent.model == MODEL
    assert await backend.ready() and backend.models() == [MODEL]
    await backend.close()


async def test_crash_mid_stream_is_replayed_on_another_worker(cluster: Cluster) -> None:
    w1 = await cluster.add("w1", crash_after=4)
    w2 = await cluster.add("w2")
    backend = backend_for(cluster)  # round robin starts at w1
    await backend.start()
    chunks = await collect(backend, request(max_tokens=12))
    assert tokens(chunks) == reference(PROMPT, 12), "the client must see one continuous, correct stream"
    assert chunks[-1].finish_reason == "length" and chunks[-1].num_prompt_tokens == len(PROMPT)
    assert len(w1.requests) == 1 and len(w2.requests) == 1
    replay = w2.requests[0]
    assert list(replay.prompt_token_ids) == [*PROMPT, *reference(PROMPT, 4)]
    assert replay.sampling.max_tokens == 8 and replay.attempt == 1 and replay.request_id == "req-1"
    assert backend.replays == 1
    await backend.close()


async def test_error_message_mid_stream_is_replayed(cluster: Cluster) -> None:
    await cluster.add("w1", error_after=3)
    await cluster.add("w2")
    backend = backend_for(cluster)
    await backend.start()
    assert tokens(await collect(backend, request(max_tokens=9))) == reference(PROMPT, 9)
    await backend.close()


async def test_retry_budget_is_enforced(cluster: Cluster) -> None:
    await cluster.add("w1", error_after=2)
    await cluster.add("w2", error_after=2)
    backend = backend_for(cluster, retries=0)
    await backend.start()
    got: list[int] = []
    with pytest.raises(BackendUnavailable, match="--request-retries"):
        async for c in backend.generate(request()):
            got.extend(c.token_ids)
    assert got == reference(PROMPT, 2), "tokens before the failure were streamed"
    await backend.close()


async def test_bad_request_is_not_retried(cluster: Cluster) -> None:
    w1 = await cluster.add("w1", refuse=common_pb2.ERROR_CODE_INVALID_ARGUMENT)
    w2 = await cluster.add("w2", refuse=common_pb2.ERROR_CODE_INVALID_ARGUMENT)
    backend = backend_for(cluster)
    await backend.start()
    with pytest.raises(InvalidRequest, match="refuses"):
        await collect(backend, request())
    assert len(w1.requests) + len(w2.requests) == 1
    assert backend.router.breakers.allows("w1") and backend.router.breakers.allows("w2")
    await backend.close()


async def test_overloaded_everywhere_is_429_and_tries_each_once(cluster: Cluster) -> None:
    fakes = [await cluster.add(f"w{i}", refuse=common_pb2.ERROR_CODE_OVERLOADED) for i in range(3)]
    backend = backend_for(cluster, retries=0)  # refusals do not use the retry budget
    await backend.start()
    with pytest.raises(BackendOverloaded) as e:
        await collect(backend, request())
    assert e.value.status == 429 and e.value.retry_after_s is not None
    assert [len(f.requests) for f in fakes] == [1, 1, 1]
    await backend.close()


async def test_draining_instance_is_skipped(cluster: Cluster) -> None:
    await cluster.add("w1", refuse=common_pb2.ERROR_CODE_DRAINING)
    await cluster.add("w2")
    backend = backend_for(cluster, retries=0)
    await backend.start()
    assert tokens(await collect(backend, request(max_tokens=5))) == reference(PROMPT, 5)
    assert backend.router.breakers.allows("w1"), "draining is not a failure"
    await backend.close()


async def test_no_ready_instance_is_503(cluster: Cluster) -> None:
    await cluster.add("p1", role="prefill")
    backend = backend_for(cluster)
    await backend.start()
    assert not await backend.ready() and backend.models() == []
    with pytest.raises(BackendUnavailable, match="no instance serving") as e:
        await collect(backend, request())
    assert e.value.retry_after_s
    await backend.close()


async def test_breaker_stops_traffic_to_a_failing_instance(cluster: Cluster) -> None:
    bad = await cluster.add("w1", refuse=common_pb2.ERROR_CODE_INTERNAL)
    good = await cluster.add("w2")
    backend = backend_for(cluster, threshold=1)
    await backend.start()
    for i in range(6):
        assert tokens(await collect(backend, request(max_tokens=2, rid=f"r{i}"))) == reference(PROMPT, 2)
    assert len(bad.requests) == 1, "after one server-side failure the breaker keeps requests away"
    assert len(good.requests) == 6
    await backend.close()


async def test_unreachable_instance_counts_as_a_failure(cluster: Cluster) -> None:
    dead = await cluster.add("w1")
    assert dead.server is not None
    await dead.server.stop(None)  # registered, but nobody listens any more (lease not expired yet)
    await cluster.add("w2")
    backend = backend_for(cluster, threshold=1)
    await backend.start()
    assert tokens(await collect(backend, request(max_tokens=3))) == reference(PROMPT, 3)
    assert not backend.router.breakers.allows("w1")
    await backend.close()


async def test_disaggregated_pair_and_prefill_rechoice(cluster: Cluster) -> None:
    d1 = await cluster.add("d1", role="decode", refuse_if_prefill="p1")
    await cluster.add("p1", role="prefill")
    await cluster.add("p2", role="prefill")
    backend = backend_for(cluster, retries=1)
    await backend.start()
    assert tokens(await collect(backend, request(max_tokens=4))) == reference(PROMPT, 4)
    targets = [r.prefill.instance_id for r in d1.requests]
    assert targets == ["p1", "p2"], "the refused hand-off must be re-tried with the other prefill"
    p2 = cluster.membership.infos["p2"]
    assert d1.requests[1].prefill.grpc_address == p2.grpc_address and d1.requests[1].prefill.epoch == p2.epoch
    await backend.close()


async def test_decode_without_prefill_prefills_locally(cluster: Cluster) -> None:
    d1 = await cluster.add("d1", role="decode")
    backend = backend_for(cluster)
    await backend.start()
    assert await backend.ready()
    await collect(backend, request(max_tokens=2))
    assert not d1.requests[0].HasField("prefill")
    await backend.close()


async def test_client_disconnect_cancels_the_call_and_publishes_a_cancel(cluster: Cluster) -> None:
    fake = await cluster.add("w1", token_delay_s=0.02)
    bus = FakeBus()
    backend = backend_for(cluster, bus=bus)
    await backend.start()
    stream = backend.generate(request(max_tokens=200, rid="gone-1"))
    first = await stream.__anext__()  # type: ignore[attr-defined]
    assert first.token_ids
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(fake.cancelled.wait(), 5.0)
    await asyncio.sleep(0)
    cancels = [m for _, m in bus.published if isinstance(m, Cancel)]
    assert [c.request_id for c in cancels] == ["gone-1"] and cancels[0].reason == "client_disconnected"
    assert backend.router.local("w1").inflight == 0
    await backend.close()


async def test_cancelled_task_also_cancels(cluster: Cluster) -> None:
    fake = await cluster.add("w1", token_delay_s=0.02)
    bus = FakeBus()
    backend = backend_for(cluster, bus=bus)
    await backend.start()
    got = asyncio.Event()

    async def consume() -> None:
        async for _ in backend.generate(request(max_tokens=200, rid="gone-2")):
            got.set()

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(got.wait(), 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(fake.cancelled.wait(), 5.0)
    assert any(isinstance(m, Cancel) and m.request_id == "gone-2" for _, m in bus.published)
    await backend.close()


async def test_completed_request_publishes_no_cancel(cluster: Cluster) -> None:
    await cluster.add("w1")
    bus = FakeBus()
    backend = backend_for(cluster, bus=bus)
    await backend.start()
    await collect(backend, request(max_tokens=3))
    assert bus.published == []
    await backend.close()


async def test_leaving_instance_loses_its_channel(cluster: Cluster) -> None:
    await cluster.add("w1")
    await cluster.add("w2")
    backend = backend_for(cluster)
    await backend.start()
    await collect(backend, request(max_tokens=1, rid="a"))
    await collect(backend, request(max_tokens=1, rid="b"))
    assert "w1" in backend.channels and "w2" in backend.channels
    cluster.membership.leave("w1")
    assert "w1" not in backend.channels and "w2" in backend.channels
    await backend.close()


async def test_metrics_collector_reports_retries_and_breakers(cluster: Cluster) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from services.gateway.backends.grpc_metrics import BackendCollector

    await cluster.add("w1", crash_after=2)
    await cluster.add("w2")
    backend = backend_for(cluster, threshold=1)
    await backend.start()
    registry = CollectorRegistry()
    registry.register(BackendCollector(backend))
    await collect(backend, request(max_tokens=5))
    text = generate_latest(registry).decode()
    assert "pdrelay:gateway_retries_total 1.0" in text and "pdrelay:gateway_replays_total 1.0" in text
    assert 'pdrelay:gateway_circuit_breakers{state="open"} 1.0' in text
    assert 'pdrelay:gateway_instances_ready{role="worker"} 2.0' in text
    await backend.close()


async def test_stream_left_open_after_the_last_message_is_cancelled(cluster: Cluster) -> None:
    fake = await cluster.add("w1", linger_s=30.0)
    backend = backend_for(cluster)
    backend.finish_grace_s = 0.2
    await backend.start()
    assert tokens(await collect(backend, request(max_tokens=3))) == reference(PROMPT, 3)
    await asyncio.wait_for(fake.cancelled.wait(), 5.0)
    await backend.close()
