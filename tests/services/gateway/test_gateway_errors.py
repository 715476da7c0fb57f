"""Every failure is an OpenAI-style error body with the right status: bad input (4xx, never 5xx), API keys,
body size limits, backend overload/unavailability (with Retry-After) and errors in the middle of a stream."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from services.gateway.backend import (
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
)
from services.gateway.mock.backend import MockBackend
from services.gateway.openai.responses import ErrorResponse
from services.gateway.text.tokenizer import RESERVED_TEMPLATE_KWARGS
from tests.services.gateway.conftest import AppFactory, client_for
from tests.services.gateway.sse_client import parse_sse

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def assert_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = msgspec.json.decode(r.content, type=ErrorResponse, strict=True).error
    assert err.message and err.type
    if param is not None:
        assert err.param == param, err
    if code is not None:
        assert err.code == code, err
    return r.json()["error"]


CHAT_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("missing messages", {}, "messages"),
    ("messages not a list", {"messages": "hi"}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("unknown role", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("content wrong type", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("unknown content part", {"messages": [{"role": "user", "content": [{"type": "video", "v": 1}]}]}, None),
    (
        "image part",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content[0]",
    ),
    ("max_tokens zero", {"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ("max_tokens negative", {"messages": MSG, "max_tokens": -5}, "max_tokens"),
    ("max_tokens string", {"messages": MSG, "max_tokens": "10"}, "max_tokens"),
    ("max_tokens float", {"messages": MSG, "max_tokens": 1.5}, "max_tokens"),
    ("max_completion_tokens zero", {"messages": MSG, "max_completion_tokens": 0}, "max_tokens"),
    ("temperature negative", {"messages": MSG, "temperature": -1}, "temperature"),
    ("temperature string", {"messages": MSG, "temperature": "hot"}, "temperature"),
    ("top_p zero", {"messages": MSG, "top_p": 0}, "top_p"),
    ("top_p above one", {"messages": MSG, "top_p": 1.5}, "top_p"),
    ("top_k below -1", {"messages": MSG, "top_k": -3}, "top_k"),
    ("top_k above vocab", {"messages": MSG, "top_k": 10**9}, "top_k"),
    ("min_p above one", {"messages": MSG, "min_p": 2}, "min_p"),
    ("presence out of range", {"messages": MSG, "presence_penalty": 3}, "presence_penalty"),
    ("frequency out of range", {"messages": MSG, "frequency_penalty": -2.5}, "frequency_penalty"),
    ("repetition zero", {"messages": MSG, "repetition_penalty": 0}, "repetition_penalty"),
    ("seed negative", {"messages": MSG, "seed": -1}, "seed"),
    ("seed huge", {"messages": MSG, "seed": 2**64}, "seed"),
    ("n=0", {"messages": MSG, "n": 0}, "n"),
    ("n too large", {"messages": MSG, "n": 65}, "n"),
    ("stop empty string", {"messages": MSG, "stop": ""}, "stop"),
    ("stop wrong type", {"messages": MSG, "stop": 5}, "stop"),
    ("too many stops", {"messages": MSG, "stop": [f"s{i}" for i in range(40)]}, "stop"),
    ("stop_token_ids out of vocab", {"messages": MSG, "stop_token_ids": [10**6]}, "stop_token_ids"),
    ("min_tokens over max", {"messages": MSG, "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ("top_logprobs without logprobs", {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ("top_logprobs too many", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("logprobs wrong type", {"messages": MSG, "logprobs": "yes"}, "logprobs"),
    ("stream_options without stream", {"messages": MSG, "stream_options": {"include_usage": True}}, "stream_options"),
    ("logit_bias out of vocab", {"messages": MSG, "logit_bias": {"999999": 10}}, "logit_bias"),
    ("logit_bias too large", {"messages": MSG, "logit_bias": {"5": 101}}, "logit_bias"),
    ("logit_bias key not an id", {"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias"),
    ("tools without function", {"messages": MSG, "tools": [{"type": "function"}]}, "tools"),
    (
        "json_schema without schema",
        {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
    ),
    (
        "json_schema that cannot compile",
        {
            "messages": MSG,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "properties": {"d": {"type": "string", "pattern": "(?<=a)b"}}},
                },
            },
        },
        "response_format",
    ),
    (
        "structured_outputs two constraints",
        {"messages": MSG, "structured_outputs": {"regex": "a", "choice": ["b"]}},
        "structured_outputs",
    ),
    ("structured_outputs bad regex", {"messages": MSG, "structured_outputs": {"regex": "a("}}, "structured_outputs"),
    ("priority negative", {"messages": MSG, "priority": -1}, "priority"),
    ("model wrong type", {"messages": MSG, "model": 5}, "model"),
    ("max_tokens over context", {"messages": MSG, "max_tokens": 10_000}, "max_tokens"),
]


@pytest.mark.parametrize("body,param", [(b, p) for _, b, p in CHAT_CASES], ids=[n for n, _, _ in CHAT_CASES])
async def test_bad_chat_requests_are_400(
    client: httpx.AsyncClient, backend: MockBackend, body: dict[str, Any], param: str | None
) -> None:
    assert_error(await client.post(CHAT, json=body), 400, param)
    assert backend.requests == []  # rejected before reaching any worker


@pytest.mark.parametrize("key", sorted(RESERVED_TEMPLATE_KWARGS))
async def test_chat_template_kwargs_naming_what_the_gateway_passes_are_400(
    client: httpx.AsyncClient, backend: MockBackend, key: str
) -> None:
    """A name the gateway or transformers passes to the template itself collides with that argument (a TypeError
    the gateway once answered with a 500 for `messages`) or changes how the prompt is built: refused by name."""
    body = {
        "model": "tiny",
        "messages": MSG,
        "chat_template_kwargs": {"enable_thinking": False, key: 1},
        "max_tokens": 2,
    }
    err = assert_error(await client.post(CHAT, json=body), 400, f"chat_template_kwargs.{key}")
    assert repr(key) in err["message"] and "remove it" in err["message"]
    assert backend.requests == []


COMPLETION_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("missing prompt", {}, "prompt"),
    ("empty prompt", {"prompt": ""}, "prompt"),
    ("empty token list", {"prompt": []}, "prompt"),
    ("token id out of vocab", {"prompt": [1, 2, 99999]}, "prompt"),
    ("negative token id", {"prompt": [-1]}, "prompt"),
    ("bool tokens", {"prompt": [True, False]}, "prompt"),
    ("batch with an empty prompt", {"prompt": ["a", ""]}, "prompt"),
    ("batch too large", {"prompt": ["a"] * 65}, "prompt"),
    ("nested junk", {"prompt": [{"a": 1}]}, "prompt"),
    ("prompt wrong type", {"prompt": 5}, "prompt"),
    ("logprobs too many", {"prompt": "x", "logprobs": 50}, "logprobs"),
    ("best_of", {"prompt": "x", "best_of": 3}, "best_of"),
    ("suffix", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("prompt longer than context", {"prompt": [5] * 600}, "prompt"),
    ("prompt fills the context", {"prompt": [5] * 512}, "prompt"),
]


@pytest.mark.parametrize(
    "body,param", [(b, p) for _, b, p in COMPLETION_CASES], ids=[n for n, _, _ in COMPLETION_CASES]
)
async def test_bad_completion_requests_are_400(
    client: httpx.AsyncClient, body: dict[str, Any], param: str | None
) -> None:
    assert_error(await client.post(COMPLETIONS, json=body), 400, param)


async def test_context_length_error_names_the_numbers(client: httpx.AsyncClient) -> None:
    err = assert_error(
        await client.post(COMPLETIONS, json={"prompt": [5] * 500, "max_tokens": 20}),
        400,
        "max_tokens",
        "context_length_exceeded",
    )
    assert "512" in err["message"] and "500" in err["message"] and "at most 12" in err["message"]


@pytest.mark.parametrize(
    "raw,code",
    [
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b"[1, 2]", None),
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "invalid_utf8"),
        (b'{"messages": []} trailing', "invalid_json"),
        (b"\x00\x01\x02", None),
    ],
)
async def test_malformed_bodies_are_400(client: httpx.AsyncClient, raw: bytes, code: str | None) -> None:
    assert_error(await client.post(CHAT, content=raw, headers={"content-type": "application/json"}), 400, code=code)


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    err = assert_error(
        await client.post(CHAT, json={"model": "gpt-9", "messages": MSG}), 404, "model", "model_not_found"
    )
    assert "tiny" in err["message"]  # lists what is served


async def test_unknown_route_and_wrong_method(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404, code="not_found")
    r = await client.get(CHAT)
    assert_error(r, 405, code="method_not_allowed")
    assert r.headers["allow"] == "POST"


async def test_body_over_the_limit_is_413(make_app: AppFactory) -> None:
    async with client_for(make_app(max_request_bytes=2048)) as c:
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        assert_error(await c.post(CHAT, json=big), 413, code="request_too_large")

        async def chunks():  # no Content-Length: the limit applies while reading
            for _ in range(10):
                yield b" " * 1000

        assert_error(await c.post(CHAT, content=chunks()), 413, code="request_too_large")
        assert_error(await c.post(CHAT, content=b"{}", headers={"content-length": "abc"}), 400)


async def test_api_key(make_app: AppFactory) -> None:
    app = make_app(api_key="s3cret")
    async with client_for(app) as c:
        r = await c.post(CHAT, json={"messages": MSG, "max_tokens": 1})
        assert_error(r, 401, code="missing_api_key")
        assert r.headers["www-authenticate"] == "Bearer"
        r = await c.post(CHAT, json={"messages": MSG, "max_tokens": 1}, headers={"authorization": "Bearer wrong"})
        assert_error(r, 401, code="invalid_api_key")
        r = await c.post(CHAT, json={"messages": MSG}, headers={"authorization": "Basic s3cret"})
        assert_error(r, 401, code="invalid_api_key")
        assert_error(await c.get("/v1/models"), 401)
        # Liveness, readiness, metrics and the schema stay open for probes and scrapers.
        for path in ("/health", "/ready", "/metrics", "/openapi.json"):
            assert (await c.get(path)).status_code == 200, path
    async with client_for(app, authorization="Bearer s3cret") as c:
        assert (await c.post(CHAT, json={"messages": MSG, "max_tokens": 1})).status_code == 200
        assert (await c.get("/v1/models")).status_code == 200
    async with client_for(make_app()) as c:  # no key configured: no check
        assert (
            await c.post(CHAT, json={"messages": MSG, "max_tokens": 1}, headers={"authorization": "Bearer anything"})
        ).status_code == 200


@pytest.mark.parametrize(
    "exc,status,code,retry_after",
    [
        (BackendOverloaded("all decode queues are full", retry_after_s=2.5), 429, "overloaded", "3"),
        (BackendOverloaded("no KV pages", status=503), 503, "overloaded", "1"),
        (BackendUnavailable("no decode instance registered", retry_after_s=1), 503, "unavailable", "1"),
        (BackendUnavailable("etcd unreachable"), 503, "unavailable", None),
        (InvalidRequest("prompt has an image but no encoder runs", param="messages"), 400, None, None),
        (ModelNotFound("no worker serves tiny"), 404, "model_not_found", None),
        (BackendTimeout("decode did not answer within 30 s"), 504, "timeout", None),
        (BackendError("decode crashed"), 500, "backend_error", None),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_backend_errors_before_the_first_token_keep_their_status(
    client: httpx.AsyncClient,
    backend: MockBackend,
    exc: Exception,
    status: int,
    code: str | None,
    retry_after: str | None,
    stream: bool,
) -> None:
    backend.fail_next.append(exc)
    r = await client.post(CHAT, json={"messages": MSG, "max_tokens": 3, "stream": stream})
    err = assert_error(r, status, code=code)
    assert str(exc) in err["message"]
    assert r.headers.get("retry-after") == retry_after


class _FailsMidStream(MockBackend):
    async def _generate(self, req):  # type: ignore[no-untyped-def,override]
        n = 0
        async for chunk in super()._generate(req):
            yield chunk
            n += 1
            if n == 2:
                raise BackendUnavailable("decode instance lost")


async def test_error_mid_stream_ends_the_stream_with_an_error_event(make_app: AppFactory) -> None:
    backend = _FailsMidStream(["tiny"])
    async with client_for(make_app(backend=backend)) as c:
        r = await c.post(CHAT, json={"messages": MSG, "max_tokens": 10, "stream": True})
        assert r.status_code == 200  # the status line was sent with the first token
        events, done = parse_sse(r.text)
        assert done and events[-1]["error"]["code"] == "unavailable"
        assert "decode instance lost" in events[-1]["error"]["message"]
        # Not streamed: the same failure is an ordinary error response.
        r = await c.post(CHAT, json={"messages": MSG, "max_tokens": 10})
        assert_error(r, 503, code="unavailable")


async def test_a_bug_in_the_backend_is_a_500_without_internals(client: httpx.AsyncClient, backend: MockBackend) -> None:
    backend.fail_next.append(RuntimeError("secret internal detail"))
    err = assert_error(await client.post(CHAT, json={"messages": MSG}), 500, code="internal_error")
    assert "secret" not in err["message"]


class _RefusesAtCall(MockBackend):
    def generate(self, req):  # type: ignore[no-untyped-def]
        raise BackendOverloaded("admission refused synchronously", retry_after_s=4)


async def test_backend_refusing_in_generate_itself_keeps_its_status(make_app: AppFactory) -> None:
    async with client_for(make_app(backend=_RefusesAtCall(["tiny"]))) as c:
        r = await c.post(CHAT, json={"messages": MSG, "max_tokens": 2, "stream": True})
    assert_error(r, 429, code="overloaded")
    assert r.headers["retry-after"] == "4"
