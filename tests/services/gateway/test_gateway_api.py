"""The OpenAI-compatible API over the mock backend: chat and completions, streamed and not, usage, logprobs,
stop strings, models, health, metrics. Expected texts come from the mock's token ids decoded by the tokenizer."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from services.gateway.mock.backend import MockBackend
from services.gateway.openai.responses import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionResponse,
    ModelList,
)
from services.gateway.text.tokenizer import GatewayTokenizer
from tests.services.gateway.conftest import MODEL, AppFactory, client_for
from tests.services.gateway.sse_client import byte_token_ids, parse_sse

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


def strict(body: bytes, typ: type) -> Any:
    """Decode with the published response type; re-encoding must give the same JSON (no field left out)."""
    obj = msgspec.json.decode(body, type=typ, strict=True)
    assert msgspec.json.decode(msgspec.json.encode(obj)) == msgspec.json.decode(body)
    return obj


async def test_chat_non_streaming(
    client: httpx.AsyncClient, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    r = await client.post(CHAT, json={"model": MODEL, "messages": MESSAGES, "max_tokens": 7, "temperature": 0})
    assert r.status_code == 200, r.text
    resp = strict(r.content, ChatCompletionResponse)
    (req,) = backend.requests
    # The prompt is the HF chat template applied by transformers itself, tokenized with special tokens as text.
    want_prompt = tiny_tokenizer.hf.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert list(req.prompt_token_ids) == list(want_prompt)
    assert req.sampling.max_tokens == 7 and req.sampling.temperature == 0.0
    expected_ids = backend.output_for(req)
    assert resp.choices[0].message.content == tiny_tokenizer.decode(expected_ids)
    assert resp.choices[0].finish_reason == "length"
    assert resp.model == MODEL and resp.id == req.request_id
    assert resp.usage.prompt_tokens == len(want_prompt)
    assert resp.usage.completion_tokens == 7
    assert resp.usage.total_tokens == len(want_prompt) + 7
    assert backend.finished == [req.request_id] and backend.cancelled == []


async def test_chat_streaming_with_usage(
    client: httpx.AsyncClient, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 9, "stream": True, "stream_options": {"include_usage": True}}
    r = await client.post(CHAT, json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events, done = parse_sse(r.text)
    assert done
    chunks = [strict(msgspec.json.encode(e), ChatCompletionChunk) for e in events]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(e["usage"] is None for e in events[:-1])  # OpenAI: null until the extra last chunk
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == []
    (req,) = backend.requests
    assert usage == {
        "prompt_tokens": len(req.prompt_token_ids),
        "completion_tokens": 9,
        "total_tokens": len(req.prompt_token_ids) + 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == tiny_tokenizer.decode(backend.output_for(req))
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert len({e["id"] for e in events}) == 1


async def test_streaming_without_usage_has_no_usage_field(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 3, "stream": True})
    events, done = parse_sse(r.text)
    assert done and all("usage" not in e for e in events)


@pytest.mark.parametrize("as_ids", [False, True])
async def test_completions_text_and_token_prompts(
    client: httpx.AsyncClient, backend: MockBackend, tiny_tokenizer: GatewayTokenizer, as_ids: bool
) -> None:
    prompt_text = "The capital of France is"
    ids = tiny_tokenizer.hf(prompt_text)["input_ids"]  # HF's own encode, special tokens included
    r = await client.post(COMPLETIONS, json={"prompt": ids if as_ids else prompt_text, "max_tokens": 5})
    assert r.status_code == 200, r.text
    resp = strict(r.content, CompletionResponse)
    (req,) = backend.requests
    assert list(req.prompt_token_ids) == ids
    assert resp.choices[0].text == tiny_tokenizer.decode(backend.output_for(req))
    assert resp.usage.prompt_tokens == len(ids) and resp.usage.completion_tokens == 5


async def test_completions_streaming(
    client: httpx.AsyncClient, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    r = await client.post(COMPLETIONS, json={"prompt": ["one prompt in a list"], "max_tokens": 6, "stream": True})
    events, done = parse_sse(r.text)
    assert done
    for e in events:
        strict(msgspec.json.encode(e), CompletionChunk)
    (req,) = backend.requests
    assert "".join(e["choices"][0]["text"] for e in events) == tiny_tokenizer.decode(backend.output_for(req))
    assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_chat_logprobs_shape(
    client: httpx.AsyncClient, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    r = await client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 5, "logprobs": True, "top_logprobs": 3})
    resp = strict(r.content, ChatCompletionResponse)
    (req,) = backend.requests
    assert req.sampling.logprobs == 3
    content = resp.choices[0].logprobs.content
    out_ids = backend.output_for(req)
    assert len(content) == 5 == resp.usage.completion_tokens
    for entry, tid in zip(content, out_ids):
        assert entry.token == tiny_tokenizer.token_text(tid)
        assert bytes(entry.bytes) == tiny_tokenizer.token_bytes(tid)
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob <= 0
        lps = [t.logprob for t in entry.top_logprobs]
        assert lps == sorted(lps, reverse=True)


async def test_chat_without_logprobs_has_null_logprobs(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2})
    assert r.json()["choices"][0]["logprobs"] is None


async def test_completion_logprobs_shape(
    client: httpx.AsyncClient, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    r = await client.post(COMPLETIONS, json={"prompt": "Numbers: 0 1 2 3", "max_tokens": 4, "logprobs": 2})
    resp = strict(r.content, CompletionResponse)
    lp = resp.choices[0].logprobs
    (req,) = backend.requests
    out_ids = backend.output_for(req)
    assert lp.tokens == [tiny_tokenizer.token_text(t) for t in out_ids]
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs if t is not None)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


async def test_multibyte_output_split_across_tokens_streams_whole_characters(
    make_app: AppFactory, tiny_tokenizer: GatewayTokenizer
) -> None:
    text = "Grüße 🙂 中文!"
    out = byte_token_ids(tiny_tokenizer, text.encode())
    backend = MockBackend([MODEL], output_token_ids=out, vocab_size=tiny_tokenizer.vocab_size)
    async with client_for(make_app(backend=backend)) as c:
        r = await c.post(CHAT, json={"messages": MESSAGES, "max_tokens": len(out), "stream": True})
    events, _ = parse_sse(r.text)
    pieces = [e["choices"][0]["delta"].get("content", "") for e in events]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_across_tokens_cuts_output_and_cancels_backend(
    make_app: AppFactory, tiny_tokenizer: GatewayTokenizer, stream: bool
) -> None:
    text = "alpha beta STOP gamma delta"
    out = byte_token_ids(tiny_tokenizer, text.encode())  # "STOP" spans 4 tokens
    backend = MockBackend([MODEL], output_token_ids=out, vocab_size=tiny_tokenizer.vocab_size)
    async with client_for(make_app(backend=backend)) as c:
        r = await c.post(
            COMPLETIONS, json={"prompt": "x", "max_tokens": len(out), "stop": ["STOP", "zzz"], "stream": stream}
        )
    if stream:
        events, done = parse_sse(r.text)
        assert done
        got = "".join(e["choices"][0]["text"] for e in events)
        last = events[-1]["choices"][0]
    else:
        got = r.json()["choices"][0]["text"]
        last = r.json()["choices"][0]
    assert got == "alpha beta "
    assert last["finish_reason"] == "stop" and last["stop_reason"] == "STOP"
    (req,) = backend.requests
    assert req.sampling.stop == ("STOP", "zzz")
    assert backend.cancelled == [req.request_id]  # the gateway closed the stream: the worker aborts


async def test_eos_from_backend_finishes_with_stop(make_app: AppFactory, tiny_tokenizer: GatewayTokenizer) -> None:
    eos = tiny_tokenizer.eos_token_ids[0]
    out = [*tiny_tokenizer.encode_text("done", add_special_tokens=False), eos, 5, 6]
    backend = MockBackend([MODEL], output_token_ids=out, eos_token_ids=[eos], vocab_size=tiny_tokenizer.vocab_size)
    async with client_for(make_app(backend=backend)) as c:
        r = await c.post(CHAT, json={"messages": MESSAGES, "max_tokens": 20})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "done"  # EOS is a special token: not in the text
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == eos


async def test_sampling_parameters_reach_the_backend(client: httpx.AsyncClient, backend: MockBackend) -> None:
    body = {
        "messages": MESSAGES,
        "max_completion_tokens": 4,
        "max_tokens": 99,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 1234,
        "stop": "END",
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "ignore_eos": True,
        "min_tokens": 2,
        "stop_token_ids": [7],
        "include_stop_str_in_output": True,
    }
    r = await client.post(CHAT, json=body, headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"})
    assert r.status_code == 200, r.text
    (req,) = backend.requests
    sp = req.sampling
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed) == (4, 0.7, 0.9, 40, 0.05, 1234)
    assert (sp.stop, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (("END",), 0.5, -0.5, 1.1)
    assert (sp.ignore_eos, sp.min_tokens, sp.stop_token_ids, sp.include_stop_str_in_output) == (True, 2, (7,), True)
    assert sp.logprobs is None
    assert dict(req.trace_headers)["traceparent"].startswith("00-aaaa")


async def test_other_chat_template_kwargs_reach_the_template(
    make_app: AppFactory, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    template = "{% if greeting %}{{ greeting }} {% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok = GatewayTokenizer(tiny_tokenizer.hf, context_length=512, chat_template=template)
    async with client_for(make_app(tokenizer=tok)) as c:
        for kwargs in (None, {"greeting": "Hello"}):
            r = await c.post(
                CHAT,
                json={"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": kwargs, "max_tokens": 1},
            )
            assert r.status_code == 200, r.text
    assert [r.prompt_token_ids for r in backend.requests] == [
        tuple(tiny_tokenizer.encode_text("hi", add_special_tokens=False)),
        tuple(tiny_tokenizer.encode_text("Hello hi", add_special_tokens=False)),
    ]


async def test_max_tokens_defaults_to_the_room_left_in_the_context(
    client: httpx.AsyncClient, backend: MockBackend, tiny_tokenizer: GatewayTokenizer
) -> None:
    backend.output_token_ids = (5,)
    r = await client.post(COMPLETIONS, json={"prompt": [5, 6, 7]})
    assert r.status_code == 200
    (req,) = backend.requests
    assert tiny_tokenizer.context_length == 512
    assert req.sampling.max_tokens == 512 - 3


async def test_models_health_ready(client: httpx.AsyncClient, backend: MockBackend) -> None:
    r = await client.get("/v1/models")
    models = strict(r.content, ModelList)
    assert [m.id for m in models.data] == [MODEL] and models.data[0].max_model_len == 512
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200
    backend.is_ready = False
    r = await client.get("/ready")
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready" and "retry-after" in r.headers


async def test_model_alias_is_accepted_and_answered_with_the_served_name(make_app: AppFactory) -> None:
    async with client_for(make_app(model_aliases=["bundled:tiny"])) as c:
        r = await c.post(CHAT, json={"model": "bundled:tiny", "messages": MESSAGES, "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == MODEL


async def test_metrics_count_requests_and_latencies(client: httpx.AsyncClient) -> None:
    for _ in range(2):
        await client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 3})
    await client.post(CHAT, json={"messages": []})
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'pdrelay:http_requests_total{endpoint="/v1/chat/completions",status="200"} 2.0' in text
    assert 'pdrelay:http_requests_total{endpoint="/v1/chat/completions",status="400"} 1.0' in text
    assert "pdrelay:time_to_first_token_seconds_count 2.0" in text
    assert "pdrelay:inter_token_latency_seconds_count 4.0" in text  # 3 tokens, one per chunk: 2 gaps each
    assert "pdrelay:e2e_request_latency_seconds_count 2.0" in text
    assert "pdrelay:generation_tokens_total 6.0" in text


async def test_openapi_lists_exactly_the_served_routes(client: httpx.AsyncClient, make_app: AppFactory) -> None:
    doc = (await client.get("/openapi.json")).json()
    app = make_app()
    assert {p: next(iter(ops)).upper() for p, ops in doc["paths"].items()} == app.routes
    schemas = doc["components"]["schemas"]
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    for ref in (
        "ChatCompletionRequest",
        "CompletionRequest",
        "ChatCompletionResponse",
        "ChatCompletionChunk",
        "CompletionResponse",
        "CompletionChunk",
        "ModelList",
        "ErrorResponse",
    ):
        assert ref in schemas
    assert "messages" in schemas["ChatCompletionRequest"]["required"]
    assert "security" not in chat
    async with client_for(make_app(api_key="k")) as c:
        secured = (await c.get("/openapi.json")).json()
    assert secured["paths"]["/v1/chat/completions"]["post"]["security"] == [{"bearer": []}]
    assert "401" in secured["paths"]["/v1/chat/completions"]["post"]["responses"]


async def test_lifespan_starts_and_closes_the_backend(app: Any, backend: MockBackend) -> None:
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[str] = []

    async def receive() -> dict[str, str]:
        return next(messages)

    async def send(m: dict[str, str]) -> None:
        sent.append(m["type"])

    await app({"type": "lifespan"}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert backend.started and backend.closed


async def test_cached_prompt_tokens_are_reported(make_app: AppFactory) -> None:
    backend = MockBackend([MODEL], cached_tokens=4)
    async with client_for(make_app(backend=backend)) as c:
        r = await c.post(COMPLETIONS, json={"prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert r.json()["usage"]["prompt_tokens"] == 6


def test_mock_backend_implements_the_protocol() -> None:
    from services.gateway.backend import GenerateBackend

    assert isinstance(MockBackend(), GenerateBackend)
