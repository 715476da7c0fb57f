"""The public gRPC Gateway API (services.gateway.grpc.api) in-process over the mock backend: generation, the same
validation as the HTTP API, typed errors, cancellation, Tokenize / ListModels / Health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import struct_pb2

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from services.gateway.backend import BackendChunk, BackendOverloaded, BackendRequest, BackendUnavailable
from services.gateway.grpc.api import ApiContext, GatewayApi
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import RESERVED_TEMPLATE_KWARGS, GatewayTokenizer
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.instance import InstanceInfo, InstanceState

MODEL = "tiny"


class Api:
    def __init__(self, api: GatewayApi, stub: gateway_pb2_grpc.GatewayStub) -> None:
        self.api, self.stub = api, stub


class Members:
    stale = True

    def __init__(self) -> None:
        self.infos = [
            InstanceInfo(
                cluster="c",
                role="worker",
                instance_id=f"w{i}",
                grpc_address="x:1",
                state=InstanceState.READY if i else InstanceState.STARTING,
            )
            for i in range(3)
        ]

    def instances(self, role: str | None = None) -> list[InstanceInfo]:
        return [i for i in self.infos if role is None or i.role == role]

    def ready(self, role: str | None = None) -> list[InstanceInfo]:
        return [i for i in self.instances(role) if i.state == InstanceState.READY]

    def on_event(self, cb: object) -> object:
        return lambda: None


@pytest.fixture
async def api(tiny_tokenizer: GatewayTokenizer, backend: MockBackend) -> AsyncIterator[Api]:
    servicer = GatewayApi()
    server = grpc.aio.server()
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Api(servicer, gateway_pb2_grpc.GatewayStub(channel))
    finally:
        await channel.close()
        await server.stop(None)


def attach(api: Api, backend: object, tokenizer: GatewayTokenizer, **kw: object) -> None:
    api.api.attach(
        ApiContext(
            backend=backend,
            tokenizer=tokenizer,
            served_model_names=(MODEL,),  # type: ignore[arg-type]
            aliases=("tiny-alias",),
            model_root="/models/tiny",
            instance_id="gw-1",
            **kw,
        )
    )  # type: ignore[arg-type]


def sampling(**kw: object) -> common_pb2.SamplingParams:
    kw.setdefault("temperature", 0.0)
    kw.setdefault("skip_special_tokens", True)
    return common_pb2.SamplingParams(**kw)  # type: ignore[arg-type]


async def generate(api: Api, req: gateway_pb2.GenerateRequest) -> list[gateway_pb2.GenerateResponse]:
    return [m async for m in api.stub.Generate(req)]


async def rpc_error(api: Api, req: gateway_pb2.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await generate(api, req)
    return e.value


async def test_unavailable_until_attached(api: Api) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await api.stub.ListModels(gateway_pb2.ListModelsRequest())
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    err = error_from_rpc(e.value)
    assert err is not None and err.code == common_pb2.ERROR_CODE_UNAVAILABLE


async def test_generate_text_streams_ids_text_and_usage(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    attach(api, backend, tiny_tokenizer)
    msgs = await generate(
        api,
        gateway_pb2.GenerateRequest(
            request_id="r-1",
            text="The capital of France is Paris.",
            sampling=sampling(max_tokens=7),
            return_token_ids=True,
        ),
    )
    want = backend.output_for(backend.requests[0])
    assert backend.requests[0].request_id == "r-1"
    assert backend.requests[0].prompt_token_ids == tuple(tiny_tokenizer.encode_text("The capital of France is Paris."))
    assert [t for m in msgs for t in m.token_ids] == want
    assert "".join(m.text for m in msgs) == tiny_tokenizer.decode(want)
    last = msgs[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert last.usage.prompt_tokens == len(backend.requests[0].prompt_token_ids) and last.usage.completion_tokens == 7
    assert all(m.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED for m in msgs[:-1])


async def test_generate_chat_and_token_ids_and_alias(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    attach(api, backend, tiny_tokenizer)
    chat = gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content="hello")])
    await generate(api, gateway_pb2.GenerateRequest(model="tiny-alias", chat=chat, sampling=sampling(max_tokens=2)))
    assert backend.requests[0].prompt_token_ids == tuple(
        tiny_tokenizer.encode_chat([{"role": "user", "content": "hello"}])
    )
    assert backend.requests[0].model == MODEL
    msgs = await generate(
        api,
        gateway_pb2.GenerateRequest(
            token_ids=gateway_pb2.TokenIds(ids=[5, 6, 7]),
            sampling=sampling(max_tokens=3, logprobs=True, top_logprobs=2),
        ),
    )
    assert backend.requests[1].prompt_token_ids == (5, 6, 7) and backend.requests[1].sampling.logprobs == 2
    lps = [lp for m in msgs for lp in m.logprobs]
    assert [lp.token_id for lp in lps] == [5, 6, 7] and all(len(lp.top_logprobs) == 2 for lp in lps)


def choice(spec: str) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        structured=common_pb2.StructuredOutput(kind=common_pb2.GRAMMAR_KIND_CHOICE, spec=spec)
    )


@pytest.mark.parametrize(
    "req,param",
    [
        (gateway_pb2.GenerateRequest(text="hi", sampling=common_pb2.SamplingParams(temperature=-1)), "temperature"),
        (gateway_pb2.GenerateRequest(text="hi", sampling=common_pb2.SamplingParams(top_p=0)), "top_p"),
        (gateway_pb2.GenerateRequest(text="hi", sampling=common_pb2.SamplingParams(max_tokens=0)), "max_tokens"),
        (gateway_pb2.GenerateRequest(token_ids=gateway_pb2.TokenIds(ids=[10**6])), "prompt"),
        (gateway_pb2.GenerateRequest(), "input"),
        (gateway_pb2.GenerateRequest(text=""), "prompt"),
        (
            gateway_pb2.GenerateRequest(
                chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="wizard", content="x")])
            ),
            "role",
        ),
        (gateway_pb2.GenerateRequest(text="hi", media=[common_pb2.MediaInput(media_hash="ab")]), "media"),
        (gateway_pb2.GenerateRequest(text="hi", sampling=common_pb2.SamplingParams(max_tokens=10**6)), "max_tokens"),
        # A CHOICE spec that is not JSON (once an unhandled JSONDecodeError: UNKNOWN), or nested past the decoder.
        (gateway_pb2.GenerateRequest(text="hi", sampling=choice("00")), "structured.spec"),
        (gateway_pb2.GenerateRequest(text="hi", sampling=choice("[" * 100_000)), "structured.spec"),
        (gateway_pb2.GenerateRequest(text="hi", sampling=choice('{"a": 1}')), "structured_outputs"),
    ],
)
async def test_invalid_requests_are_invalid_argument(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer, req: gateway_pb2.GenerateRequest, param: str
) -> None:
    attach(api, backend, tiny_tokenizer)
    e = await rpc_error(api, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert param in (e.details() or "")
    err = error_from_rpc(e)
    assert err is not None and err.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT and not err.retryable
    assert backend.requests == [], "nothing invalid reaches the backend"


def chat_with(kwargs: dict[str, object]) -> gateway_pb2.ChatMessages:
    struct = struct_pb2.Struct()
    struct.update(kwargs)
    return gateway_pb2.ChatMessages(
        messages=[gateway_pb2.ChatMessage(role="user", content="hi")], chat_template_kwargs=struct
    )


@pytest.mark.parametrize("key", sorted(RESERVED_TEMPLATE_KWARGS))
async def test_chat_template_kwargs_naming_what_the_gateway_passes_are_invalid_argument(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer, key: str
) -> None:
    """As over HTTP: Generate and Tokenize refuse the name (once `messages` was an unhandled TypeError)."""
    attach(api, backend, tiny_tokenizer)
    chat = chat_with({"enable_thinking": False, key: 1})
    e = await rpc_error(api, gateway_pb2.GenerateRequest(chat=chat, sampling=sampling(max_tokens=2)))
    with pytest.raises(grpc.aio.AioRpcError) as t:
        await api.stub.Tokenize(gateway_pb2.TokenizeRequest(chat=chat))
    for err in (e, t.value):
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert repr(key) in (err.details() or "") and "chat_template_kwargs" in (err.details() or "")
        typed = error_from_rpc(err)
        assert typed is not None and typed.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT and not typed.retryable
    assert backend.requests == []


async def test_chat_template_kwargs_reach_the_template(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    template = "{{ greeting }} {{ count }} {{ ratio }}{% for m in messages %} {{ m['content'] }}{% endfor %}"
    tok = GatewayTokenizer(tiny_tokenizer.hf, context_length=512, chat_template=template)
    attach(api, backend, tok)
    chat = chat_with({"greeting": "Hello", "count": 3, "ratio": 0.5})
    await generate(api, gateway_pb2.GenerateRequest(chat=chat, sampling=sampling(max_tokens=1)))
    want = tiny_tokenizer.encode_text("Hello 3 0.5 hi", add_special_tokens=False)  # 3, not 3.0: a JSON integer
    assert backend.requests[0].prompt_token_ids == tuple(want)
    assert list((await api.stub.Tokenize(gateway_pb2.TokenizeRequest(chat=chat))).token_ids) == want


async def test_unknown_model_is_not_found(api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer) -> None:
    attach(api, backend, tiny_tokenizer)
    e = await rpc_error(api, gateway_pb2.GenerateRequest(model="gpt-9", text="hi"))
    assert e.code() == grpc.StatusCode.NOT_FOUND and "gpt-9" in (e.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as t:
        await api.stub.Tokenize(gateway_pb2.TokenizeRequest(model="gpt-9", text="hi"))
    assert t.value.code() == grpc.StatusCode.NOT_FOUND


async def test_backend_admission_errors_keep_their_meaning(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    attach(api, backend, tiny_tokenizer)
    backend.fail_next = [BackendOverloaded("all full"), BackendUnavailable("nobody home")]
    e = await rpc_error(api, gateway_pb2.GenerateRequest(text="hi"))
    err = error_from_rpc(e)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err is not None and err.retryable
    e = await rpc_error(api, gateway_pb2.GenerateRequest(text="hi"))
    assert e.code() == grpc.StatusCode.UNAVAILABLE and "nobody home" in (e.details() or "")


class _FailsMidStream:
    def generate(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[BackendChunk]:
        yield BackendChunk((65,))
        raise BackendUnavailable("worker lost and retries exhausted")

    async def ready(self) -> bool:
        return True

    def models(self) -> list[str]:
        return [MODEL]


async def test_error_after_the_first_message_ends_the_stream_with_an_error(
    api: Api, tiny_tokenizer: GatewayTokenizer
) -> None:
    attach(api, _FailsMidStream(), tiny_tokenizer)
    msgs = await generate(api, gateway_pb2.GenerateRequest(text="hi", sampling=sampling(max_tokens=5)))
    assert msgs[-1].finish_reason == common_pb2.FINISH_REASON_ERROR
    assert msgs[-1].error.code == common_pb2.ERROR_CODE_UNAVAILABLE and "retries exhausted" in msgs[-1].error.message


async def test_stop_string_ends_the_stream_and_aborts_the_backend(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    attach(api, backend, tiny_tokenizer)
    backend.output_token_ids = tuple(tiny_tokenizer.encode_text("abc STOP def ghi jkl", add_special_tokens=False))
    msgs = await generate(api, gateway_pb2.GenerateRequest(text="x", sampling=sampling(max_tokens=50, stop=["STOP"])))
    assert "".join(m.text for m in msgs) == "abc "
    assert msgs[-1].finish_reason == common_pb2.FINISH_REASON_STOP and msgs[-1].matched_stop.text == "STOP"
    assert backend.cancelled, "the worker must be told to stop generating"


async def test_cancelled_rpc_cancels_the_backend_stream(
    api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    attach(api, backend, tiny_tokenizer)
    backend.token_delay_s = 0.01
    call = api.stub.Generate(gateway_pb2.GenerateRequest(text="hello", sampling=sampling(max_tokens=500)))
    await call.read()
    call.cancel()
    await asyncio.wait_for(backend.cancelled_event.wait(), 5.0)


async def test_tokenize_models_health(api: Api, backend: MockBackend, tiny_tokenizer: GatewayTokenizer) -> None:
    attach(api, backend, tiny_tokenizer, membership=Members())
    tok = await api.stub.Tokenize(gateway_pb2.TokenizeRequest(text="hello world"))
    assert list(tok.token_ids) == tiny_tokenizer.encode_text("hello world")
    assert tok.max_model_len == tiny_tokenizer.context_length
    chat = await api.stub.Tokenize(
        gateway_pb2.TokenizeRequest(
            chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content="hi")])
        )
    )
    assert list(chat.token_ids) == tiny_tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    models = await api.stub.ListModels(gateway_pb2.ListModelsRequest())
    assert [(m.id, m.root, m.owned_by) for m in models.models] == [(MODEL, "/models/tiny", "pdrelay")]
    health = await api.stub.Health(gateway_pb2.HealthRequest())
    assert health.serving and health.discovery_stale
    assert [(r.role, r.ready, r.total) for r in health.roles] == [("worker", 2, 3)]
    backend.is_ready = False
    assert not (await api.stub.Health(gateway_pb2.HealthRequest())).serving
