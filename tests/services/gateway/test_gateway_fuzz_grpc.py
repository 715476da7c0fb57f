"""Fuzz target of the gateway's gRPC API (`test_no_grpc_message_causes_an_internal_error`): GenerateRequest,
TokenizeRequest and EmbeddingsRequest with every field drawn, plausible nine times in ten. No INTERNAL, UNKNOWN or
UNIMPLEMENTED status; every error carries a typed pdrelay Error.

How a failure is replayed and kept as an `@example`, and how to run the target long: fuzzing.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import text_format
from hypothesis import event, example, given
from hypothesis import strategies as st

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from services.gateway.grpc.api import ApiContext, GatewayApi
from services.gateway.http.embeddings import Embeddings
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.cluster.grpc_errors import error_from_rpc
from tests.services.gateway.conftest import MODEL, StandInEncoders
from tests.services.gateway.fuzzing import TEMPLATE_NAMES, TRACEPARENT, fuzz_settings, mostly

EXAMPLES_GRPC = 200


uint32s = st.integers(0, 2**32 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
floats32 = st.floats(width=32)  # NaN and infinities included
token_ids = mostly(st.integers(0, 480), uint32s)
texts = st.text(max_size=24) | st.sampled_from(["hi", "", "\x00", "<|im_end|>", "{{ messages }}", "🙂"])
struct_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
template_kwargs = st.dictionaries(st.sampled_from(TEMPLATE_NAMES) | st.text(max_size=6), struct_values, max_size=3)


@st.composite
def chat_messages(draw: st.DrawFn) -> gateway_pb2.ChatMessages:
    roles = mostly(st.sampled_from(["user", "system", "assistant", "tool"]), st.just("developer") | texts)
    chat = gateway_pb2.ChatMessages(
        messages=[
            gateway_pb2.ChatMessage(role=draw(roles), content=draw(texts))
            for _ in range(draw(mostly(st.integers(1, 3), st.just(0))))
        ]
    )
    kwargs = draw(st.none() | template_kwargs)
    if kwargs is not None:
        chat.chat_template_kwargs.update(kwargs)
        chat.chat_template_kwargs.SetInParent()  # an empty Struct is still set
    return chat


_SPECS = {  # a spec of each grammar kind the server may accept
    common_pb2.GRAMMAR_KIND_JSON_OBJECT: st.just(""),
    common_pb2.GRAMMAR_KIND_JSON_SCHEMA: st.sampled_from(['{"type": "object"}', '{"type": "string"}']),
    common_pb2.GRAMMAR_KIND_REGEX: st.sampled_from(["a+", "[0-9]{1,3}", "(yes|no)"]),
    common_pb2.GRAMMAR_KIND_CHOICE: st.sampled_from(['["yes", "no"]', '["a"]']),
    common_pb2.GRAMMAR_KIND_GRAMMAR: st.sampled_from(['root ::= "a" | "b"']),
}


@st.composite
def sampling_params(draw: st.DrawFn) -> common_pb2.SamplingParams:
    sp = common_pb2.SamplingParams(
        stop=draw(st.lists(texts, max_size=2)),
        stop_token_ids=draw(st.lists(token_ids, max_size=2)),
        ignore_eos=draw(st.booleans()),
        logprobs=draw(st.booleans()),
        top_logprobs=draw(mostly(st.integers(0, 5), uint32s)),
        presence_penalty=draw(mostly(st.floats(-2, 2, width=32), floats32)),
        frequency_penalty=draw(mostly(st.floats(-2, 2, width=32), floats32)),
        skip_special_tokens=draw(st.booleans()),
        logit_bias=draw(st.dictionaries(token_ids, mostly(st.floats(-100, 100, width=32), floats32), max_size=2)),
        n=draw(mostly(st.integers(0, 3), uint32s)),
    )
    optional = {  # field -> (plausible, wild)
        "temperature": (st.floats(0, 2, width=32), floats32),
        "top_p": (st.floats(0, 1, exclude_min=True, width=32), floats32),
        "top_k": (st.integers(-1, 500), int32s),
        "min_p": (st.floats(0, 1, width=32), floats32),
        "seed": (st.integers(0, 2**63 - 1), st.integers(0, 2**64 - 1)),
        "max_tokens": (st.integers(1, 8), uint32s),
        "min_tokens": (st.integers(0, 4), uint32s),
        "repetition_penalty": (st.floats(0, 3, exclude_min=True, width=32), floats32),
        "prompt_logprobs": (st.integers(0, 5), uint32s),
    }
    for name, (plausible, wild) in optional.items():
        value = draw(st.none() | mostly(plausible, wild))
        if value is not None:
            setattr(sp, name, value)
    if draw(st.integers(0, 3)) == 0:
        kind = draw(mostly(st.sampled_from(sorted(_SPECS)), st.integers(-3, 9)))
        sp.structured.kind = kind
        sp.structured.spec = draw(mostly(_SPECS.get(kind, texts), texts | st.sampled_from(["[1]", "[", "{", "00"])))
        sp.structured.accepted_token_ids.extend(draw(st.lists(token_ids, max_size=2)))
    return sp


@st.composite
def generate_requests(draw: st.DrawFn) -> gateway_pb2.GenerateRequest:
    req = gateway_pb2.GenerateRequest(
        request_id=draw(st.sampled_from(["", "r-1"]) | texts),
        model=draw(mostly(st.sampled_from(["", MODEL, "tiny-alias"]), st.just("gpt-9") | texts)),
        return_token_ids=draw(st.booleans()),
        priority=draw(mostly(st.integers(0, 4), uint32s)),
        echo=draw(st.booleans()),
    )
    which = draw(mostly(st.sampled_from(["text", "token_ids", "chat"]), st.none()))
    if which == "text":
        req.text = draw(texts)
    elif which == "token_ids":
        req.token_ids.ids.extend(draw(st.lists(token_ids, max_size=6)))
    elif which == "chat":
        req.chat.CopyFrom(draw(chat_messages()))
    if draw(st.integers(0, 3)) > 0:
        req.sampling.CopyFrom(draw(sampling_params()))
    if draw(st.integers(0, 19)) == 0:
        req.media.append(common_pb2.MediaInput(media_hash=draw(texts)))
    if draw(st.booleans()):
        req.trace.traceparent = draw(st.sampled_from([TRACEPARENT, "00-zz"]) | texts)
        req.trace.tracestate = draw(texts)
    return req


@st.composite
def tokenize_requests(draw: st.DrawFn) -> gateway_pb2.TokenizeRequest:
    req = gateway_pb2.TokenizeRequest(
        model=draw(mostly(st.sampled_from(["", MODEL]), st.just("gpt-9") | texts)),
        add_special_tokens=draw(st.booleans()),
    )
    which = draw(mostly(st.sampled_from(["text", "chat"]), st.none()))
    if which == "text":
        req.text = draw(texts)
    elif which == "chat":
        req.chat.CopyFrom(draw(chat_messages()))
    return req


@st.composite
def embeddings_requests(draw: st.DrawFn) -> gateway_pb2.EmbeddingsRequest:
    req = gateway_pb2.EmbeddingsRequest(
        request_id=draw(st.sampled_from(["", "e-1"]) | texts),
        model=draw(mostly(st.sampled_from(["", "mini"]), st.just(MODEL) | texts)),
        dimensions=draw(mostly(st.sampled_from([0, 8, 4]), uint32s)),
        truncate_prompt_tokens=draw(mostly(st.integers(-1, 8), int32s)),
    )
    which = draw(mostly(st.sampled_from(["texts", "token_ids"]), st.sampled_from(["both", "neither"])))
    if which in ("texts", "both"):
        req.texts.extend(draw(st.lists(texts, min_size=1, max_size=3)))
    if which in ("token_ids", "both"):
        for ids in draw(st.lists(st.lists(token_ids, max_size=4), min_size=1, max_size=3)):
            req.token_ids.append(gateway_pb2.TokenIds(ids=ids))
    if draw(st.booleans()):
        req.trace.traceparent = draw(st.sampled_from([TRACEPARENT, "00-zz"]) | texts)
    return req


GrpcRequest = gateway_pb2.GenerateRequest | gateway_pb2.TokenizeRequest | gateway_pb2.EmbeddingsRequest


class GrpcApi:
    """The gateway's gRPC API served in process on its own event loop, for a synchronous hypothesis test."""

    def __init__(self, tokenizer: GatewayTokenizer, backend: MockBackend) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)  # grpc.aio binds its calls to the current loop
        self.server, self.channel, self.stub = self.loop.run_until_complete(self._start(tokenizer, backend))

    async def _start(
        self, tokenizer: GatewayTokenizer, backend: MockBackend
    ) -> tuple[grpc.aio.Server, grpc.aio.Channel, gateway_pb2_grpc.GatewayStub]:
        ctx = ApiContext(
            backend=backend,
            tokenizer=tokenizer,
            served_model_names=(MODEL,),
            aliases=("tiny-alias",),
            embeddings=Embeddings(StandInEncoders()),  # type: ignore[arg-type]
        )
        server = grpc.aio.server()
        gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayApi(ctx), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        return server, channel, gateway_pb2_grpc.GatewayStub(channel)

    def run(self, call: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(call, 30))

    def close(self) -> None:
        self.loop.run_until_complete(self.channel.close())
        self.loop.run_until_complete(self.server.stop(None))
        asyncio.set_event_loop(None)
        self.loop.close()


@pytest.fixture
def grpc_api(tiny_tokenizer: GatewayTokenizer) -> Iterator[GrpcApi]:
    api = GrpcApi(tiny_tokenizer, MockBackend([MODEL], vocab_size=tiny_tokenizer.vocab_size))
    try:
        yield api
    finally:
        api.close()


_SERVER_FAULTS = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNIMPLEMENTED)


def check_rpc_error(e: grpc.aio.AioRpcError, request: str) -> None:
    assert e.code() not in _SERVER_FAULTS, f"{request}\n-> {e.code()} {e.details()}"
    err = error_from_rpc(e)
    assert err is not None, f"{request}\n-> {e.code()} without a typed Error: {e.details()}"
    assert err.code != common_pb2.ERROR_CODE_INTERNAL, f"{request}\n-> {err}"


def as_example(req: GrpcRequest) -> str:
    """The request as an @example of the gRPC target takes it: its type and text format."""
    return f"req=grpc_request({type(req).__name__!r}, {text_format.MessageToString(req, as_one_line=True)!r})"


def grpc_request(kind: str, text: str) -> GrpcRequest:
    return text_format.Parse(text, getattr(gateway_pb2, kind)())


async def _generate(stub: gateway_pb2_grpc.GatewayStub, req: gateway_pb2.GenerateRequest) -> None:
    async for m in stub.Generate(req):
        if m.finish_reason == common_pb2.FINISH_REASON_ERROR:
            assert m.error.code != common_pb2.ERROR_CODE_INTERNAL, f"{as_example(req)}\n-> {m.error}"


# Inputs this target has failed on, each with its fix.
# A CHOICE spec that is not JSON: JSONDecodeError, an UNKNOWN status (grpc/api.py _choice: a 400).
@example(
    req=grpc_request(
        "GenerateRequest", 'token_ids { } sampling { structured { kind: GRAMMAR_KIND_CHOICE spec: "00" } }'
    )
)
@fuzz_settings(EXAMPLES_GRPC)
@given(req=generate_requests() | tokenize_requests() | embeddings_requests())
def test_no_grpc_message_causes_an_internal_error(grpc_api: GrpcApi, req: GrpcRequest) -> None:
    if isinstance(req, gateway_pb2.GenerateRequest):
        call = _generate(grpc_api.stub, req)
    elif isinstance(req, gateway_pb2.TokenizeRequest):
        call = grpc_api.stub.Tokenize(req)
    else:
        call = grpc_api.stub.Embed(req)
    try:
        grpc_api.run(call)
        event(f"{type(req).__name__} -> OK")
    except grpc.aio.AioRpcError as e:
        event(f"{type(req).__name__} -> {e.code().name}")
        check_rpc_error(e, as_example(req))
