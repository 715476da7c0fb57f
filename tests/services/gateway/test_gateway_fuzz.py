"""Fuzz targets of the gateway's HTTP API: no request, however odd, makes it answer a server error.

- Bodies (`test_no_body_causes_a_server_error`): random JSON documents, requests of each POST route (chat,
  completions, tokenize, detokenize, embeddings over stand-in encoders) with fields replaced by plausible or random
  JSON values, and random bytes. No 5xx; every non-2xx is an OpenAI error body.
- Headers (`test_no_header_causes_a_server_error`): the headers the gateway reads (Authorization, Content-Type,
  Content-Length, traceparent, tracestate) and others, with well-formed, near-miss and random values, on every
  route, with an API key and tracing on. Same checks.

How a failure is replayed and kept as an `@example`, and how to run a target long: fuzzing.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.gateway.http.app import GatewayApp
from services.gateway.http.embeddings import Embeddings
from services.gateway.openai.responses import ErrorResponse
from shared.telemetry.tracing import Tracing
from tests.services.gateway.conftest import MODEL, AppFactory, StandInEncoders, client_for
from tests.services.gateway.fuzzing import TEMPLATE_NAMES, TRACEPARENT, fuzz_settings, mostly

EXAMPLES_BODIES = 300
EXAMPLES_HEADERS = 200


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
    "tool_choice",
    "parallel_tool_calls",
    "structured_outputs",
    "include_stop_str_in_output",
    "prompt_logprobs",
    "priority",
    # /tokenize, /detokenize, /v1/embeddings
    "add_special_tokens",
    "return_token_strs",
    "tokens",
    "input",
    "encoding_format",
    "dimensions",
    "truncate_prompt_tokens",
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
        "role": mostly(st.sampled_from(["user", "system", "assistant", "tool"]), st.just("bot") | json_values),
        "content": mostly(st.text(max_size=30), json_values),
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


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# For each field, values the server may well accept, so that mutated bodies get past validation into templating,
# generation and answer encoding, where random JSON values alone rarely go.
_probability = st.floats(0, 1)
_token = st.integers(0, 480)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL, "mini"]),
    "max_tokens": st.none() | st.integers(1, 8),
    "max_completion_tokens": st.none() | st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": _probability,
    "top_k": st.integers(-1, 500),
    "min_p": _probability,
    "seed": st.integers(0, 2**64),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "n": st.integers(1, 3),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.01, 3),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 8),
    "stop_token_ids": st.lists(_token, max_size=3),
    "logprobs": st.booleans() | st.integers(0, 20),
    "top_logprobs": st.integers(0, 20),
    "logit_bias": st.dictionaries(_token.map(str), st.floats(-100, 100), max_size=3),
    "echo": st.booleans(),
    "best_of": st.integers(1, 2),
    "tools": st.lists(st.just(TOOL), min_size=1, max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]),
    "parallel_tool_calls": st.booleans(),
    "response_format": st.sampled_from(
        [
            {"type": "text"},
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        ]
    ),
    "structured_outputs": st.sampled_from(
        [{"regex": "a+"}, {"choice": ["yes", "no"]}, {"json": {"type": "object"}}, {"json_object": True}]
    ),
    "chat_template_kwargs": st.dictionaries(st.sampled_from(TEMPLATE_NAMES) | st.text(max_size=6), json_values),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "prompt_logprobs": st.integers(0, 20),
    "priority": st.integers(0, 10),
    "add_special_tokens": st.booleans(),
    "return_token_strs": st.booleans(),
    "tokens": st.lists(_token, max_size=6),
    "input": st.text(min_size=1, max_size=20) | st.lists(_token, min_size=1, max_size=6),
    "encoding_format": st.sampled_from(["float", "base64"]),
    "dimensions": st.integers(1, 64),
    "truncate_prompt_tokens": st.integers(-1, 10),
}


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    body = dict(draw(base))
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        body[key] = draw(PLAUSIBLE.get(key, json_values) | json_values)
    return body


valid_tokenize = st.fixed_dictionaries({"prompt": st.text(max_size=20)}) | st.fixed_dictionaries(
    {"messages": st.lists(message, min_size=1, max_size=3)}
)
valid_detokenize = st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 600), max_size=6)})
valid_embedding = st.fixed_dictionaries(
    {
        "model": st.just("mini"),
        "input": st.text(min_size=1, max_size=20) | st.lists(st.integers(0, 600), min_size=1, max_size=6),
    }
)
VALID_BODIES = {  # route -> requests it accepts
    "/v1/chat/completions": valid_chat,
    "/v1/completions": valid_completion,
    "/tokenize": valid_tokenize,
    "/detokenize": valid_detokenize,
    "/v1/embeddings": valid_embedding,
}


def _body(value: Any) -> bytes:
    return json.dumps(value).encode()


@st.composite
def http_requests(draw: st.DrawFn) -> tuple[str, bytes]:
    """(route, body): mostly a mutated request of that route, sometimes another route's, any JSON or bytes."""
    endpoint = draw(st.sampled_from(sorted(VALID_BODIES)))
    kind = draw(st.integers(0, 9))
    if kind < 6:
        body = _body(draw(mutated(VALID_BODIES[endpoint])))
    elif kind < 8:
        body = _body(draw(mutated(st.one_of(*VALID_BODIES.values()))))
    elif kind < 9:
        body = _body(draw(json_values))
    else:
        body = draw(st.binary(max_size=64))
    return endpoint, body


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


HI = [{"role": "user", "content": "hi"}]


# Inputs this target has failed on, each with its fix.
# chat_template_kwargs naming encode_chat's own argument: TypeError, a 500 (issue 49; RESERVED_TEMPLATE_KWARGS).
@example(
    request=(
        "/v1/chat/completions",
        _body({"model": MODEL, "messages": HI, "chat_template_kwargs": {"messages": 1}, "max_tokens": 2}),
    )
)
@fuzz_settings(EXAMPLES_BODIES)
@given(request=http_requests())
def test_no_body_causes_a_server_error(app_with_embeddings: GatewayApp, request: tuple[str, bytes]) -> None:
    endpoint, body = request

    async def go() -> None:
        async with client_for(app_with_embeddings) as c:
            r = await c.post(endpoint, content=body, headers={"content-type": "application/json"})
            ctype = r.headers.get("content-type")
            event(f"{endpoint} -> {r.status_code}")  # the spread of answers, in --hypothesis-show-statistics
            check_answer(r.status_code, ctype and ctype.encode(), r.content, f"request={request!r}")

    asyncio.run(go())


# ------------------------------------------------------------------ HTTP headers

API_KEY = "k3y"
ROUTES = {  # path -> its method and a body it accepts
    "/v1/chat/completions": ("POST", _body({"messages": HI, "max_tokens": 2})),
    "/v1/completions": ("POST", _body({"prompt": "hi", "max_tokens": 2, "stream": True})),
    "/tokenize": ("POST", _body({"prompt": "hi"})),
    "/detokenize": ("POST", _body({"tokens": [5, 6]})),
    "/v1/embeddings": ("POST", _body({"model": "mini", "input": "hi"})),
    "/v1/models": ("GET", b""),
    "/health": ("GET", b""),
    "/ready": ("GET", b""),
    "/metrics": ("GET", b""),
    "/openapi.json": ("GET", b""),
}
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


@st.composite
def header_requests(draw: st.DrawFn) -> tuple[str, str, list[tuple[bytes, bytes]], bytes]:
    """(path, method, headers, body): mostly the route's own method and body with the API key (first: the value
    the gateway reads), so that most requests get past the key check to the headers read after it."""
    path = draw(st.sampled_from(sorted(ROUTES)))
    method, body = ROUTES[path]
    if draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
    if draw(st.integers(0, 9)) == 0:
        body = draw(st.binary(max_size=32))
    headers = draw(header_lists)
    if draw(st.integers(0, 3)) > 0:
        headers.insert(0, (b"authorization", f"Bearer {API_KEY}".encode()))
    return path, method, headers, body


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
@given(request=header_requests())
def test_no_header_causes_a_server_error(
    keyed_traced_app: GatewayApp, request: tuple[str, str, list[tuple[bytes, bytes]], bytes]
) -> None:
    path, method, headers, body = request
    status, resp_headers, content = asyncio.run(asgi_call(keyed_traced_app, method, path, headers, body))
    event(f"-> {status}")
    what = f"request={request!r}"
    assert status >= 200, f"{what}\n-> no answer"
    check_answer(status, resp_headers.get(b"content-type"), content, what)
