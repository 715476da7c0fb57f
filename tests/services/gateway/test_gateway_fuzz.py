"""Fuzz targets of the gateway: no request, however odd, makes it answer a server error.

- HTTP bodies (`test_no_body_causes_a_server_error`): random JSON documents, valid requests of each POST route
  (chat, completions, tokenize, detokenize, embeddings over stand-in encoders) with fields replaced by random JSON
  values, and random bytes, sent to any of those routes. No 5xx; every non-2xx is an OpenAI error body.
- HTTP headers (`test_no_header_causes_a_server_error`): the headers the gateway reads (Authorization,
  Content-Type, Content-Length, traceparent, tracestate) and others, with well-formed, near-miss and random values,
  on every route, with an API key and tracing on. Same checks.
- gRPC messages (`test_no_grpc_message_causes_an_internal_error`): GenerateRequest, TokenizeRequest and
  EmbeddingsRequest with every field drawn at random. No INTERNAL or UNKNOWN status; every error carries a typed
  pdrelay Error.

The search is random, a new seed each run (new inputs are what a fuzz test in CI is for). What a run finds is kept:
- A failure's message starts with the failing input written as the target's `@example` takes it (hypothesis' own
  listing of the arguments prints blank here: schemathesis, imported by the suite, replaces hypothesis' printer),
  and hypothesis adds a `@reproduce_failure(...)` line (print_blob): pasted above the test, it replays exactly that
  input. The local example database (.hypothesis/) also replays it first on the next local run, and
  `pytest --hypothesis-seed=N` repeats a whole run.
- Every input a target has ever failed on is kept as an explicit `@example` on it, with the fix it led to, so every
  run tries it first. Add the printed input there together with the fix.
- PDRELAY_FUZZ_EXAMPLES=N runs N random examples per target instead of the defaults below (EXAMPLES_*), e.g. a long
  run of one target:
      PDRELAY_FUZZ_EXAMPLES=10000 nice -n 10 .venv/bin/python -m pytest -q -p no:cacheprovider \\
          tests/services/gateway/test_gateway_fuzz.py -k body
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import grpc
import msgspec
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from services.gateway.grpc.api import ApiContext, GatewayApi
from services.gateway.http.app import GatewayApp
from services.gateway.http.embeddings import Embeddings
from services.gateway.mock.backend import MockBackend
from services.gateway.openai.responses import ErrorResponse
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.cluster.grpc_errors import error_from_rpc
from shared.telemetry.tracing import Tracing
from tests.services.gateway.conftest import MODEL, AppFactory, StandInEncoders, client_for

EXAMPLES_BODIES = 300
EXAMPLES_HEADERS = 200
EXAMPLES_GRPC = 200


def fuzz_settings(default_examples: int) -> settings:
    examples = int(os.environ.get("PDRELAY_FUZZ_EXAMPLES") or default_examples)
    return settings(
        max_examples=examples,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "echo",
    "best_of",
    "tools",
    "response_format",
    "chat_template_kwargs",
    "skip_special_tokens",
    # /tokenize, /detokenize, /v1/embeddings
    "add_special_tokens",
    "return_token_strs",
    "tokens",
    "input",
    "encoding_format",
    "dimensions",
    "truncate_prompt_tokens",
]
# Names that mean something to a chat template or to the code that renders it: its arguments, transformers'
# apply_chat_template parameters, the special tokens it passes, the Jinja globals a template calls.
TEMPLATE_NAMES = [
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "tokenize",
    "chat_template",
    "conversation",
    "continue_final_message",
    "return_dict",
    "padding",
    "self",
    "enable_thinking",
    "bos_token",
    "eos_token",
    "raise_exception",
    "strftime_now",
    "range",
    "namespace",
    "loop",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(FIELDS + TEMPLATE_NAMES + ["role", "content", "type", "text"]) | st.text(max_size=5),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "bot"]) | json_values,
        "content": st.text(max_size=30) | json_values,
    }
)
valid_chat = st.fixed_dictionaries(
    {"messages": st.lists(message, min_size=1, max_size=3), "max_tokens": st.integers(min_value=1, max_value=4)}
)
valid_completion = st.fixed_dictionaries(
    {
        "prompt": st.text(min_size=1, max_size=20) | st.lists(st.integers(0, 600), min_size=1, max_size=6),
        "max_tokens": st.integers(min_value=1, max_value=4),
    }
)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    body = dict(draw(base))
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        body[key] = draw(json_values)
    return body


valid_tokenize = st.fixed_dictionaries({"prompt": st.text(max_size=20)}) | st.fixed_dictionaries(
    {"messages": st.lists(json_values, min_size=1, max_size=3)}
)
valid_detokenize = st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 600), max_size=6)})
valid_embedding = st.fixed_dictionaries(
    {
        "model": st.just("mini"),
        "input": st.text(min_size=1, max_size=20) | st.lists(st.integers(0, 600), min_size=1, max_size=6),
    }
)
BODY_ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/v1/embeddings"]

bodies = (
    st.one_of(
        *(mutated(b) for b in (valid_chat, valid_completion, valid_tokenize, valid_detokenize, valid_embedding))
    ).map(lambda b: json.dumps(b).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
)


def with_embeddings(app: GatewayApp) -> GatewayApp:
    """/v1/embeddings mounted over the stand-in encoders."""
    embeddings = Embeddings(StandInEncoders())  # type: ignore[arg-type]
    app.add_route("/v1/embeddings", "POST", embeddings.http, models=embeddings.model_cards)
    return app


@pytest.fixture
def app_with_embeddings(make_app: AppFactory) -> GatewayApp:
    return with_embeddings(make_app())


def check_answer(status: int, content_type: bytes | None, content: bytes, request: str) -> None:
    """No 5xx; a 4xx is an OpenAI error body. `request` (the input, as an @example takes it) leads the message."""
    assert status < 500, f"{request}\n-> {status} {content[:400]!r}"
    if status >= 400:
        assert content_type == b"application/json", f"{request}\n-> {status} content-type {content_type!r}"
        try:
            msgspec.json.decode(content, type=ErrorResponse, strict=True)
        except msgspec.ValidationError as e:
            raise AssertionError(f"{request}\n-> {status}, not an OpenAI error body ({e}): {content[:400]!r}") from e


def _body(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


HI = [{"role": "user", "content": "hi"}]


# Inputs this target has failed on, each with its fix.
# chat_template_kwargs naming encode_chat's own argument: TypeError, a 500 (issue 49; RESERVED_TEMPLATE_KWARGS).
@example(
    body=_body({"model": MODEL, "messages": HI, "chat_template_kwargs": {"messages": 1}, "max_tokens": 2}),
    endpoint="/v1/chat/completions",
)
@fuzz_settings(EXAMPLES_BODIES)
@given(body=bodies, endpoint=st.sampled_from(BODY_ENDPOINTS))
def test_no_body_causes_a_server_error(app_with_embeddings: GatewayApp, body: bytes, endpoint: str) -> None:
    async def go() -> None:
        async with client_for(app_with_embeddings) as c:
            r = await c.post(endpoint, content=body, headers={"content-type": "application/json"})
            ctype = r.headers.get("content-type")
            check_answer(r.status_code, ctype and ctype.encode(), r.content, f"body={body!r}, endpoint={endpoint!r}")

    asyncio.run(go())


# ------------------------------------------------------------------ HTTP headers

API_KEY = "k3y"
ROUTES = {  # path -> a body it accepts
    "/v1/chat/completions": _body({"messages": HI, "max_tokens": 2}),
    "/v1/completions": _body({"prompt": "hi", "max_tokens": 2, "stream": True}),
    "/tokenize": _body({"prompt": "hi"}),
    "/detokenize": _body({"tokens": [5, 6]}),
    "/v1/models": b"",
    "/health": b"",
    "/ready": b"",
    "/metrics": b"",
    "/openapi.json": b"",
    "/v1/embeddings": _body({"model": "mini", "input": "hi"}),
}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# Token characters (RFC 9110), lower-case: what an HTTP server hands an ASGI app as a header name.
_NAME_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
header_names = st.sampled_from(
    [b"authorization", b"content-type", b"content-length", b"traceparent", b"tracestate", b"accept", b"x-request-id"]
) | st.text(_NAME_CHARS, min_size=1, max_size=12).map(str.encode)
# A field value as a server passes it on: visible ASCII, space, tab and obs-text (0x80-0xFF); no CR, LF or NUL.
field_values = st.binary(max_size=80).map(lambda b: bytes(c for c in b if c == 9 or 32 <= c != 127))
near_values = st.sampled_from(
    [
        f"Bearer {API_KEY}",
        f"bearer   {API_KEY}  ",
        "Bearer",
        "Bearer ",
        f"Basic {API_KEY}",
        "application/json",
        "application/json; charset=utf-8",
        "application/vnd.api+json",
        "text/plain",
        ";",
        "0",
        "-1",
        "1e3",
        "0x10",
        " 12 ",
        "1_0",
        "9" * 5000,
        TRACEPARENT,
        TRACEPARENT.upper(),
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-0000000000000000-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
        "=,=,,",
    ]
).map(str.encode)
traceparents = st.builds(
    lambda v, t, s, f: f"{v}-{t}-{s}-{f}".encode(),
    st.text("0123456789abcdefABCDEF-", max_size=3),
    st.text("0123456789abcdef", max_size=34),
    st.text("0123456789abcdef", max_size=18),
    st.text("0123456789abcdef-", max_size=4),
)
header_lists = st.lists(st.tuples(header_names, field_values | near_values | traceparents), max_size=6)


async def asgi_call(
    app: GatewayApp, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request straight into the ASGI app, headers exactly as given (httpx would normalize or refuse some)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("gateway", 80),
    }
    done = asyncio.Event()
    body_sent = False
    status = 0
    resp_headers: dict[bytes, bytes] = {}
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # as a server: the client stays until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            resp_headers.update(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    await asyncio.wait_for(app(scope, receive, send), 30)
    assert done.is_set(), f"{method} {path}: the app returned without finishing the answer"
    return status, resp_headers, b"".join(chunks)


@pytest.fixture
def keyed_traced_app(make_app: AppFactory) -> Iterator[GatewayApp]:
    app = with_embeddings(make_app(api_key=API_KEY))
    app.tracing = Tracing.start(
        "unused:1", role="gateway", instance_id="g", cluster="c", exporter=InMemorySpanExporter()
    )
    try:
        yield app
    finally:
        app.tracing.shutdown()


@fuzz_settings(EXAMPLES_HEADERS)
@given(
    path=st.sampled_from(sorted(ROUTES)),
    method=st.sampled_from(["GET", "POST", "POST", "PUT"]),
    headers=header_lists,
    junk_body=st.none() | st.binary(max_size=32),
)
def test_no_header_causes_a_server_error(
    keyed_traced_app: GatewayApp, path: str, method: str, headers: list[tuple[bytes, bytes]], junk_body: bytes | None
) -> None:
    body = ROUTES[path] if junk_body is None else junk_body
    status, resp_headers, content = asyncio.run(asgi_call(keyed_traced_app, method, path, headers, body))
    request = f"path={path!r}, method={method!r}, headers={headers!r}, junk_body={junk_body!r}"
    assert status >= 200, f"{request}\n-> no answer"
    check_answer(status, resp_headers.get(b"content-type"), content, request)


# ------------------------------------------------------------------ gRPC messages

uint32s = st.integers(0, 4) | st.integers(0, 2**32 - 1)
int32s = st.integers(-2, 4) | st.integers(-(2**31), 2**31 - 1)
floats32 = st.floats(-3, 3, width=32) | st.floats(width=32)  # NaN and infinities included
texts = st.text(max_size=24) | st.sampled_from(["hi", "", "\x00", "<|im_end|>", "{{ messages }}", "🙂"])
struct_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
template_kwargs = st.dictionaries(st.sampled_from(TEMPLATE_NAMES) | st.text(max_size=6), struct_values, max_size=3)


@st.composite
def chat_messages(draw: st.DrawFn) -> gateway_pb2.ChatMessages:
    roles = st.sampled_from(["user", "system", "assistant", "tool", "developer", ""]) | texts
    chat = gateway_pb2.ChatMessages(
        messages=[
            gateway_pb2.ChatMessage(role=draw(roles), content=draw(texts)) for _ in range(draw(st.integers(0, 3)))
        ]
    )
    kwargs = draw(st.none() | template_kwargs)
    if kwargs is not None:
        chat.chat_template_kwargs.update(kwargs)
        chat.chat_template_kwargs.SetInParent()  # an empty Struct is still set
    return chat


@st.composite
def sampling_params(draw: st.DrawFn) -> common_pb2.SamplingParams:
    sp = common_pb2.SamplingParams(
        stop=draw(st.lists(texts, max_size=3)),
        stop_token_ids=draw(st.lists(uint32s, max_size=3)),
        ignore_eos=draw(st.booleans()),
        logprobs=draw(st.booleans()),
        top_logprobs=draw(uint32s),
        presence_penalty=draw(floats32),
        frequency_penalty=draw(floats32),
        skip_special_tokens=draw(st.booleans()),
        logit_bias=draw(st.dictionaries(uint32s, floats32, max_size=3)),
        n=draw(st.integers(0, 3) | uint32s),
    )
    optional = {
        "temperature": floats32,
        "top_p": floats32,
        "top_k": int32s,
        "min_p": floats32,
        "seed": st.integers(0, 2**64 - 1),
        "max_tokens": st.integers(0, 8) | uint32s,
        "min_tokens": uint32s,
        "repetition_penalty": floats32,
        "prompt_logprobs": uint32s,
    }
    for name, values in optional.items():
        value = draw(st.none() | values)
        if value is not None:
            setattr(sp, name, value)
    if draw(st.booleans()):
        sp.structured.kind = draw(st.sampled_from(list(common_pb2.GrammarKind.values())) | st.integers(-3, 9))
        sp.structured.spec = draw(texts | st.sampled_from(['["a", "b"]', "[1]", '{"type": "object"}', "a+", "[", "{"]))
        sp.structured.accepted_token_ids.extend(draw(st.lists(uint32s, max_size=2)))
    return sp


@st.composite
def generate_requests(draw: st.DrawFn) -> gateway_pb2.GenerateRequest:
    req = gateway_pb2.GenerateRequest(
        request_id=draw(st.sampled_from(["", "r-1"]) | texts),
        model=draw(st.sampled_from(["", MODEL, "tiny-alias", "gpt-9"]) | texts),
        return_token_ids=draw(st.booleans()),
        priority=draw(uint32s),
        echo=draw(st.booleans()),
    )
    which = draw(st.sampled_from(["text", "token_ids", "chat", None]))
    if which == "text":
        req.text = draw(texts)
    elif which == "token_ids":
        req.token_ids.ids.extend(draw(st.lists(st.integers(0, 600) | uint32s, max_size=6)))
    elif which == "chat":
        req.chat.CopyFrom(draw(chat_messages()))
    if draw(st.booleans()):
        req.sampling.CopyFrom(draw(sampling_params()))
    if draw(st.integers(0, 9)) == 0:
        req.media.append(common_pb2.MediaInput(media_hash=draw(texts)))
    if draw(st.booleans()):
        req.trace.traceparent = draw(st.sampled_from([TRACEPARENT, "00-zz"]) | texts)
        req.trace.tracestate = draw(texts)
    return req


@st.composite
def tokenize_requests(draw: st.DrawFn) -> gateway_pb2.TokenizeRequest:
    req = gateway_pb2.TokenizeRequest(
        model=draw(st.sampled_from(["", MODEL, "gpt-9"])), add_special_tokens=draw(st.booleans())
    )
    which = draw(st.sampled_from(["text", "chat", None]))
    if which == "text":
        req.text = draw(texts)
    elif which == "chat":
        req.chat.CopyFrom(draw(chat_messages()))
    return req


@st.composite
def embeddings_requests(draw: st.DrawFn) -> gateway_pb2.EmbeddingsRequest:
    req = gateway_pb2.EmbeddingsRequest(
        request_id=draw(st.sampled_from(["", "e-1"]) | texts),
        model=draw(st.sampled_from(["", "mini", MODEL]) | texts),
        texts=draw(st.lists(texts, max_size=3)),
        dimensions=draw(uint32s),
        truncate_prompt_tokens=draw(int32s),
    )
    for ids in draw(st.lists(st.lists(st.integers(0, 600) | uint32s, max_size=4), max_size=3)):
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
    except grpc.aio.AioRpcError as e:
        check_rpc_error(e, as_example(req))
