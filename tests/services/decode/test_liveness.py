"""A decode's liveness probe of the prefills it waits on (services/decode/liveness.py), over real gRPC."""

from __future__ import annotations

import asyncio
import socket

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from services.decode.liveness import PeerWatch
from services.decode.prefill_choice import PrefillChoice
from shared.cluster.breaker import BreakerState


async def test_an_answering_peer_stays_alive_and_a_silent_one_is_found_dead_in_seconds() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    # A peer that accepts connections and never speaks (a stopped process: the kernel still accepts).
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    channels: dict[str, grpc.aio.Channel] = {}

    def channel(address: str) -> grpc.aio.Channel:
        return channels.setdefault(address, grpc.aio.insecure_channel(address))

    watch = PeerWatch(channel, interval_s=0.1, timeout_s=0.3, misses=2)
    alive_at, silent_at = f"127.0.0.1:{port}", f"127.0.0.1:{silent.getsockname()[1]}"
    try:
        async with watch.watching(alive_at) as alive_dead, watch.watching(silent_at) as silent_dead:
            async with watch.watching(silent_at) as same:  # a second hand-off to it shares the probe
                assert same is silent_dead
                await asyncio.wait_for(silent_dead.wait(), 5.0)
            await asyncio.sleep(0.5)
            assert not alive_dead.is_set()
        assert watch.found_dead == 1 and not watch._watches  # probes stop with the last hand-off
    finally:
        silent.close()
        for ch in channels.values():
            await ch.close()
        await server.stop(None)


def test_a_silent_prefill_leaves_rotation_at_once_an_outlier_after_repeated_failures() -> None:
    c = PrefillChoice(max_timeout_s=30.0, min_timeout_s=3.0)
    c.done(c.attempt("p1", 100), 4.0, ok=False, sick=True)
    assert c.breakers.allows("p1")  # one failed hand-off: still in rotation (the threshold is 2)
    c.done(c.attempt("p2", 100), 4.0, ok=False, sick=True, silent=True)
    assert c.breakers.get("p2").state == BreakerState.OPEN  # silence is not an outlier: out now


async def test_the_computed_signal_reaches_decode_before_the_answer() -> None:
    """Prefill's initial metadata arrives while it still works: the hand-off call can see it (unary-stream)."""
    from proto.pdrelay.v1 import worker_pb2, worker_pb2_grpc
    from services.decode.prefill_call import PREFILL_METHOD
    from shared.serving.handoff import COMPUTED_KEY

    class Slow(worker_pb2_grpc.PrefillServicer):
        async def Prefill(self, request, context):  # type: ignore[no-untyped-def]
            await context.send_initial_metadata(((COMPUTED_KEY, "1"),))
            await asyncio.sleep(2.0)
            return worker_pb2.PrefillResponse(request_id=request.request_id)

    server = grpc.aio.server()
    worker_pb2_grpc.add_PrefillServicer_to_server(Slow(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = ch.unary_stream(
            PREFILL_METHOD,
            request_serializer=worker_pb2.HandoffTicket.SerializeToString,
            response_deserializer=worker_pb2.PrefillResponse.FromString,
        )(worker_pb2.HandoffTicket(request_id="r1"), timeout=5.0)
        md = await asyncio.wait_for(call.initial_metadata(), 1.0)  # well before the 2 s answer
        assert (COMPUTED_KEY, "1") in tuple(md)
        assert (await call.read()).request_id == "r1"
    finally:
        await ch.close()
        await server.stop(None)
