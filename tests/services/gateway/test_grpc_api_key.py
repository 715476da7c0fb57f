"""--api-key on the gateway's gRPC API: Generate, Tokenize, ListModels and the Gateway Health RPC need
`authorization: Bearer <key>`; grpc.health.v1 stays open. The interceptor is the one GatewayService installs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from proto.pdrelay.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.grpc.api import ApiContext, GatewayApi
from services.gateway.grpc.auth import ApiKeyInterceptor, bearer_token_matches
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import GatewayTokenizer

KEY = "s3cret-key"


@pytest.fixture
async def channel(tiny_tokenizer: GatewayTokenizer, backend: MockBackend) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server(interceptors=[ApiKeyInterceptor(KEY)])
    gateway_pb2_grpc.add_GatewayServicer_to_server(
        GatewayApi(ApiContext(backend=backend, tokenizer=tiny_tokenizer, served_model_names=("tiny",))), server
    )
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ch
    finally:
        await ch.close()
        await server.stop(None)


async def _calls(stub: gateway_pb2_grpc.GatewayStub, metadata: tuple[tuple[str, str], ...]) -> list[object]:
    """Every Gateway RPC once; each result is the response or the gRPC status code it ended with."""
    out: list[object] = []
    gen = gateway_pb2.GenerateRequest(text="hi")
    gen.sampling.max_tokens = 2
    for call in (
        lambda: stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=metadata),
        lambda: stub.Tokenize(gateway_pb2.TokenizeRequest(text="hi"), metadata=metadata),
        lambda: stub.Health(gateway_pb2.HealthRequest(), metadata=metadata),
    ):
        try:
            out.append(await call())
        except grpc.aio.AioRpcError as e:
            out.append(e.code())
    try:
        out.append([m async for m in stub.Generate(gen, metadata=metadata)])
    except grpc.aio.AioRpcError as e:
        out.append(e.code())
    return out


@pytest.mark.parametrize(
    "metadata",
    [(), (("authorization", "Bearer wrong"),), (("authorization", KEY),), (("authorization", f"Basic {KEY}"),)],
)
async def test_calls_without_the_key_are_unauthenticated(
    channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]
) -> None:
    results = await _calls(gateway_pb2_grpc.GatewayStub(channel), metadata)
    assert results == [grpc.StatusCode.UNAUTHENTICATED] * 4


async def test_calls_with_the_key_are_served(channel: grpc.aio.Channel) -> None:
    results = await _calls(gateway_pb2_grpc.GatewayStub(channel), (("authorization", f"Bearer {KEY}"),))
    assert not any(isinstance(r, grpc.StatusCode) for r in results), results
    assert results[0].models[0].id == "tiny"  # type: ignore[attr-defined]
    assert results[3][-1].finish_reason  # type: ignore[index]


async def test_standard_health_stays_open(channel: grpc.aio.Channel) -> None:
    resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_bearer_token_matching() -> None:
    key = KEY.encode()
    assert bearer_token_matches(f"Bearer {KEY}", key) and bearer_token_matches(f"bearer  {KEY} ", key)
    for bad in (None, "", KEY, f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer", f"Token {KEY}"):
        assert not bearer_token_matches(bad, key), bad
    with pytest.raises(ValueError, match="--api-key"):
        ApiKeyInterceptor("")
