"""One OpenAI streaming request: request bodies, and TTFT/ITL/E2E and token counts from scripted SSE timings."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from bench.serve.client import RequestOptions, build_body, send_request, served_model
from bench.serve.datasets import BenchRequest
from bench.serve.http_client import HTTP_CLIENTS, make_http
from tests.bench.serve.scripted_server import ScriptedServer, chat_chunk, completion_chunk, usage_chunk

GAP = 0.04  # seconds between scripted chunks: far above loopback noise, small enough for a fast test


def _words(text: str) -> int:
    return len(text.split())


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    s = await ScriptedServer().start()
    try:
        yield s
    finally:
        await s.close()


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
async def test_completion_timings_and_usage(server: ScriptedServer, kind: str) -> None:
    server.scripts["/v1/completions"] = [
        (2 * GAP, completion_chunk(" a")),
        (GAP, completion_chunk(" b")),
        (GAP, completion_chunk(" c")),
        (GAP, completion_chunk("")),  # finish chunk without text: ends E2E, not an ITL entry
        (0.0, usage_chunk(11, 4)),
        (0.0, "[DONE]"),
    ]
    http = make_http(kind, server.url)
    try:
        r = await send_request(http, "/v1/completions", b"{}", prompt_len=99, count_tokens=_words)
    finally:
        await http.aclose()
    assert r.success, r.error
    assert r.generated_text == " a b c"
    assert (r.prompt_tokens, r.output_tokens) == (11, 4)  # the server's usage wins over our counts
    assert 2 * GAP * 0.9 <= r.ttft_s < 2 * GAP + 0.5
    assert len(r.itl_s) == 2 and all(GAP * 0.9 <= g < GAP + 0.5 for g in r.itl_s)
    assert r.latency_s >= r.ttft_s + sum(r.itl_s) + GAP * 0.9
    assert r.tpot_s == pytest.approx((r.latency_s - r.ttft_s) / 3)


async def test_chat_role_chunk_does_not_count_as_first_token(server: ScriptedServer) -> None:
    server.scripts["/v1/chat/completions"] = [
        (0.0, chat_chunk("", role="assistant")),  # sent at once by some servers, before any token
        (3 * GAP, chat_chunk("Hello")),
        (GAP, chat_chunk(" world")),
        (0.0, "[DONE]"),
    ]
    http = make_http("raw", server.url)
    try:
        r = await send_request(http, "/v1/chat/completions", b"{}", prompt_len=7, count_tokens=_words)
    finally:
        await http.aclose()
    assert r.success and r.generated_text == "Hello world"
    assert r.ttft_s >= 3 * GAP * 0.9
    # no usage chunk: output counted with the tokenizer callback, prompt from the dataset
    assert (r.prompt_tokens, r.output_tokens) == (7, 2)


async def test_failures_are_results_not_exceptions(server: ScriptedServer) -> None:
    server.scripts["/v1/err-event"] = [(0.0, {"error": {"message": "worker died"}})]
    server.scripts["/v1/empty"] = [(0.0, "[DONE]")]
    http = make_http("raw", server.url)
    try:
        r = await send_request(http, "/error", b"{}", prompt_len=1, count_tokens=_words)
        assert not r.success and "HTTP 400" in r.error and "max_tokens too large" in r.error
        r = await send_request(http, "/v1/err-event", b"{}", prompt_len=1, count_tokens=_words)
        assert not r.success and "worker died" in r.error
        r = await send_request(http, "/v1/empty", b"{}", prompt_len=1, count_tokens=_words)
        assert not r.success and "without a single choice" in r.error
        assert await served_model(http) == "scripted"
    finally:
        await http.aclose()
    closed = make_http("raw", "http://127.0.0.1:1")
    r = await send_request(closed, "/v1/completions", b"{}", prompt_len=1, count_tokens=_words)
    assert not r.success and r.error


def test_completion_bodies() -> None:
    opts = RequestOptions("/v1/completions", "m", extra_body={"top_k": 1})
    body = json.loads(build_body(BenchRequest(" hi there", 2, 8), opts))
    assert body == {
        "model": "m",
        "prompt": " hi there",
        "max_tokens": 8,
        "stream": True,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "top_k": 1,
    }
    ids = json.loads(build_body(BenchRequest((5, 6, 7), 3, 2), RequestOptions("/v1/completions", "m")))
    assert ids["prompt"] == [5, 6, 7]
    sys_req = BenchRequest(" q", 3, 2, system=" sys")
    hist = json.loads(build_body(sys_req, opts, history=[(" u0", " a0")]))
    assert hist["prompt"] == " sys u0 a0 q"
    no_eos = json.loads(build_body(sys_req, RequestOptions("/v1/completions", "m", ignore_eos=False)))
    assert "ignore_eos" not in no_eos


def test_chat_bodies() -> None:
    opts = RequestOptions("/v1/chat/completions", "m")
    req = BenchRequest(" q1", 2, 4, system=" sys")
    body = json.loads(build_body(req, opts, history=[(" u0", " a0")]))
    assert body["messages"] == [
        {"role": "system", "content": " sys"},
        {"role": "user", "content": " u0"},
        {"role": "assistant", "content": " a0"},
        {"role": "user", "content": " q1"},
    ]
    assert body["max_tokens"] == 4 and body["stream_options"] == {"include_usage": True}
    with pytest.raises(ValueError, match="--endpoint /v1/completions"):
        build_body(BenchRequest((1, 2), 2, 4), opts)
