"""Response shapes over the mock backend: n > 1 choices (streamed and whole, usage counting the prompt once), a list
of prompts as one response with indexed choices, echo, logit_bias / priority / structured specs reaching the
backend request, the gRPC API's priority and structured outputs reaching the worker request."""

from __future__ import annotations

import json

import httpx

from services.gateway.mock.backend import MockBackend
from shared.grammar.spec import GrammarKind

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def _events(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]


async def test_n_choices_whole_and_streamed(client: httpx.AsyncClient, backend: MockBackend):
    r = await client.post(CHAT, json={"messages": MSG, "n": 3, "max_tokens": 4})
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in body["choices"]}) == 1  # the mock repeats one stream
    single = (await client.post(CHAT, json={"messages": MSG, "max_tokens": 4})).json()
    assert body["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]  # the prompt once
    assert body["usage"]["completion_tokens"] == 3 * single["usage"]["completion_tokens"]
    assert backend.requests[0].sampling.n == 3
    r = await client.post(CHAT, json={"messages": MSG, "n": 2, "max_tokens": 4, "stream": True})
    ev = _events(r)
    texts: dict[int, str] = {}
    finishes = {}
    for e in ev:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["delta"].get("content", "")
            if c["finish_reason"]:
                finishes[c["index"]] = c["finish_reason"]
    assert texts[0] == texts[1] == single["choices"][0]["message"]["content"]
    assert finishes == {0: "length", 1: "length"}


async def test_a_list_of_prompts_is_one_response(client: httpx.AsyncClient, backend: MockBackend):
    r = await client.post(COMPLETIONS, json={"prompt": ["one", "two two", [5, 6, 7]], "max_tokens": 3, "n": 2})
    body = r.json()
    assert r.status_code == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3, 4, 5]
    prompts = [q.prompt_token_ids for q in backend.requests]
    assert len(prompts) == 3 and prompts[2] == (5, 6, 7)
    assert body["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)
    r = await client.post(COMPLETIONS, json={"prompt": ["a b", "c"], "max_tokens": 2, "stream": True})
    idx = {c["index"] for e in _events(r) for c in e["choices"]}
    assert idx == {0, 1}


async def test_echo_prepends_the_prompt(client: httpx.AsyncClient, tiny_tokenizer):
    r = (await client.post(COMPLETIONS, json={"prompt": "The capital", "max_tokens": 3, "echo": True})).json()
    plain = (await client.post(COMPLETIONS, json={"prompt": "The capital", "max_tokens": 3})).json()
    assert r["choices"][0]["text"] == "The capital" + plain["choices"][0]["text"]


async def test_sampling_extensions_reach_the_backend(client: httpx.AsyncClient, backend: MockBackend):
    r = await client.post(
        CHAT,
        json={
            "messages": MSG,
            "max_tokens": 2,
            "logit_bias": {"7": -100, "3": 5.5},
            "priority": 4,
            "response_format": {"type": "json_object"},
        },
    )
    assert r.status_code == 200
    q = backend.requests[-1]
    assert q.sampling.logit_bias == ((3, 5.5), (7, -100.0)) and q.priority == 4
    assert q.sampling.structured is not None and q.sampling.structured.kind is GrammarKind.JSON_OBJECT
    r = await client.post(
        COMPLETIONS, json={"prompt": "x", "max_tokens": 2, "structured_outputs": {"choice": ["a", "b"]}}
    )
    assert backend.requests[-1].sampling.structured.kind is GrammarKind.CHOICE


def test_wire_carries_priority_structured_and_replayed_tokens():
    from types import SimpleNamespace

    from proto.pdrelay.v1 import common_pb2, gateway_pb2
    from services.gateway.backend import BackendRequest
    from services.gateway.grpc.api import plan_of
    from services.gateway.routing.wire import decode_request
    from shared.cluster.sampling_pb import sampling_from_pb
    from shared.grammar.spec import StructuredSpec
    from shared.modelspec.sampling import SamplingParams

    spec = StructuredSpec(GrammarKind.REGEX, "[a-z]+")
    req = BackendRequest(
        request_id="r",
        model="m",
        prompt_token_ids=(1, 2),
        priority=7,
        sampling=SamplingParams(structured=spec, logit_bias=((3, 1.0),), n=2),
    )
    msg = decode_request(req, SimpleNamespace(prefill=None), [9, 8], attempt=1)  # type: ignore[arg-type]
    assert msg.priority == 7 and list(msg.prompt_token_ids) == [1, 2, 9, 8]
    sp = sampling_from_pb(msg.sampling)  # what the worker's engine gets
    assert sp.structured == StructuredSpec(GrammarKind.REGEX, "[a-z]+", (9, 8)) and sp.logit_bias == ((3, 1.0),)
    assert sp.n == 2
    g = gateway_pb2.GenerateRequest(
        text="hi",
        priority=3,
        sampling=common_pb2.SamplingParams(
            structured=common_pb2.StructuredOutput(kind=common_pb2.GRAMMAR_KIND_CHOICE, spec='["x", "y"]')
        ),
    )
    p = plan_of(g, 512)  # the gateway's gRPC API
    assert p.priority == 3 and p.sampling.structured.kind is GrammarKind.CHOICE


async def test_tokenize_and_detokenize(client: httpx.AsyncClient, tiny_tokenizer):
    r = (await client.post("/tokenize", json={"prompt": "The capital of France", "return_token_strs": True})).json()
    assert r["tokens"] == tiny_tokenizer.encode_text("The capital of France") and r["count"] == len(r["tokens"])
    assert "".join(r["token_strs"]).replace("\u0120", " ").endswith("France")
    chat = (await client.post("/tokenize", json={"messages": MSG})).json()
    assert chat["tokens"] == tiny_tokenizer.encode_chat(MSG)
    back = (await client.post("/detokenize", json={"tokens": r["tokens"]})).json()
    assert back["prompt"].endswith("The capital of France")
    bad = await client.post("/detokenize", json={"tokens": [10**7]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert (await client.post("/tokenize", json={"prompt": "x", "model": "nope"})).status_code == 404
