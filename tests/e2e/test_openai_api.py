"""The OpenAI API extensions through a real cluster with the official `openai` client, colocated (one worker) and
disaggregated (prefill + decode, KV over NIXL), on a random-weight model (garbage unless constrained):

structured outputs (json_schema strict, json_object, the structured_outputs extension) validate and are the same
greedy tokens as the engine run in this process (so colocated == disaggregated); an uncompilable schema is a 400
naming the part; tool calling (required, named, auto with a tool history) incl. streamed deltas reassembled by the
client's stream helper.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from tests.helpers.cluster_procs import TOPOLOGIES, ApiCluster, api_cluster
from tests.helpers.schema_corpus import MAX_TOKENS, SCHEMAS
from tests.helpers.tiny_models import make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PICKED = [SCHEMAS[i] for i in (1, 11, 27, 33, 38, 43)]
MESSAGES = [{"role": "user", "content": "Give me a record."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]},
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = make_tiny_model(tmp_path_factory.mktemp("api-models"), "llama")
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 4096  # the byte-level toy tokenizer makes the tools prompt ~700 tokens
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def cluster(
    request: pytest.FixtureRequest,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ApiCluster]:
    with api_cluster(request.param, model_dir, tmp_path_factory.mktemp(f"api-{request.param}")) as c:
        deadline = time.monotonic() + 60
        while httpx.get(f"{c.http}/ready").status_code != 200:
            assert time.monotonic() < deadline, c.logs()
            time.sleep(0.2)
        yield c


@pytest.fixture(scope="module")
def client(cluster: ApiCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.http}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(model_dir: Path):  # -> Callable[[list[int], StructuredSpec], str]
    """Greedy structured output of the engine in this process (the ground truth for both topologies)."""
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.modelspec.sampling import SamplingParams

    engine = Engine.from_config(
        resolve(
            "worker", ["--model", str(model_dir), "--num-pages", "512", "--threads", "1", "--dtype", "float32"], env={}
        )
    )

    def run(prompt: list[int], spec, max_tokens: int) -> str:  # type: ignore[no-untyped-def]
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, structured=spec)
        return engine.generate([prompt], sp)[0].text

    return run


def _prompt_ids(model_dir: Path) -> list[int]:
    from services.gateway.text.tokenizer import GatewayTokenizer

    return GatewayTokenizer.from_dir(model_dir).encode_chat(MESSAGES)


def test_json_schema_outputs_validate_and_match_the_engine(
    client: openai.OpenAI, cluster: ApiCluster, reference, model_dir: Path
) -> None:
    from shared.grammar.spec import GrammarKind, StructuredSpec

    prompt = _prompt_ids(model_dir)
    for schema in PICKED:
        r = client.chat.completions.create(
            model=cluster.model_dir.name,
            messages=MESSAGES,
            temperature=0,
            max_tokens=MAX_TOKENS,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}},
        )
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), schema)
        spec = StructuredSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema, sort_keys=True))
        assert text == reference(prompt, spec, MAX_TOKENS), f"{cluster.topology}: {schema}"


def test_json_object_and_the_structured_outputs_extension(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=openai.NOT_GIVEN,
        messages=MESSAGES,
        temperature=0.7,
        seed=3,
        max_tokens=200,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.chat.completions.create(
        messages=MESSAGES,
        model=openai.NOT_GIVEN,
        temperature=1.0,
        max_tokens=20,
        extra_body={"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}},
    )
    assert r.choices[0].message.content in ("alpha", "beta", "gamma")
    c = client.completions.create(
        model=openai.NOT_GIVEN,
        prompt="Code:",
        max_tokens=20,
        temperature=1.0,
        extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{3}"}},
    )
    assert __import__("re").fullmatch("[A-Z]{3}-[0-9]{3}", c.choices[0].text), c.choices[0].text


def test_a_schema_that_cannot_compile_is_a_400_naming_the_part(client: openai.OpenAI) -> None:
    bad = {
        "type": "object",
        "properties": {"when": {"type": "object", "properties": {"day": {"type": "string", "pattern": "(?<=x)y"}}}},
    }
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=openai.NOT_GIVEN,
            messages=MESSAGES,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": bad}},
        )
    assert "properties.when.properties.day.pattern" in str(e.value) and "Lookbehind" in str(e.value)


def test_tool_calls_required_and_named(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=openai.NOT_GIVEN,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    for call in choice.message.tool_calls:
        schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    r = client.chat.completions.create(
        model=openai.NOT_GIVEN,
        messages=[{"role": "user", "content": "Time?"}],
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=100,
        temperature=0.9,
        seed=1,
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments)["tz"] in ("UTC", "CET")


def test_streamed_tool_calls_reassembled_by_the_client(client: openai.OpenAI) -> None:
    kw = {
        "model": openai.NOT_GIVEN,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 200,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    with client.chat.completions.stream(**kw) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    got = [(c.function.name, json.loads(c.function.arguments)) for c in final.choices[0].message.tool_calls]
    want = [(c.function.name, json.loads(c.function.arguments)) for c in whole.choices[0].message.tool_calls]
    assert got == want and got[0][0] == "get_weather"


def test_tool_history_and_auto(client: openai.OpenAI) -> None:
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "-3"},
    ]
    r = client.chat.completions.create(
        model=openai.NOT_GIVEN, messages=history, tools=[WEATHER], max_tokens=8, temperature=0
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    r = client.chat.completions.create(
        model=openai.NOT_GIVEN, messages=history, tools=[WEATHER], tool_choice="none", max_tokens=8, temperature=0
    )
    assert r.choices[0].message.tool_calls is None


def test_n_samples_one_prompt(client: openai.OpenAI) -> None:
    kw = {"model": openai.NOT_GIVEN, "messages": MESSAGES, "n": 3, "seed": 7, "temperature": 1.0, "max_tokens": 8}
    a = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    b = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2] and texts == [c.message.content for c in b.choices]
    assert len(set(texts)) == 3
    one = client.chat.completions.create(
        model=openai.NOT_GIVEN, messages=MESSAGES, seed=8, temperature=1.0, max_tokens=8
    )
    assert one.choices[0].message.content == texts[1]  # sample i is seeded with seed + i
    assert a.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert a.usage.completion_tokens == sum(len(c) > 0 for c in texts) * 8


def test_a_list_of_prompts_echo_and_extensions(client: openai.OpenAI, cluster: ApiCluster) -> None:
    prompts = ["The capital", "Numbers: 1 2"]
    # (the two prompts share decode steps, so a random model's near-tied logits may break differently than when
    # each runs alone: the batch is checked for its shape and prompt -> choice mapping, not for token equality)
    batch = client.completions.create(
        model=openai.NOT_GIVEN,
        prompt=prompts,
        max_tokens=6,
        temperature=0,
        echo=True,
        extra_body={"priority": 2, "top_k": 5, "min_p": 0.05},
    )
    assert [c.index for c in batch.choices] == [0, 1]
    assert all(c.text.startswith(p) and len(c.text) > len(p) for c, p in zip(batch.choices, prompts, strict=True))
    assert batch.usage.completion_tokens == 12
    single = client.completions.create(model=openai.NOT_GIVEN, prompt=prompts[0], max_tokens=6, temperature=0)
    echoed = client.completions.create(
        model=openai.NOT_GIVEN, prompt=prompts[0], max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == prompts[0] + single.choices[0].text
    tok = httpx.post(f"{cluster.http}/tokenize", json={"prompt": prompts[0]}).json()
    assert (
        httpx.post(f"{cluster.http}/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"].endswith(prompts[0])
    )
    assert [m.id for m in client.models.list().data] == [cluster.model_dir.name]


def test_echo_with_logprobs_gives_the_prompt_logprobs_of_hf(client: openai.OpenAI, cluster: ApiCluster) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    prompt = "Numbers: 1 2 3 4"
    ids = httpx.post(f"{cluster.http}/tokenize", json={"prompt": prompt}).json()["tokens"]
    hf = AutoModelForCausalLM.from_pretrained(cluster.model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)  # row p predicts token p + 1
    plain = client.completions.create(model=openai.NOT_GIVEN, prompt=prompt, max_tokens=5, temperature=0)
    for _ in range(2):  # the second time the prompt sits in the prefix cache (skipped for prompt logprobs)
        r = client.completions.create(
            model=openai.NOT_GIVEN, prompt=prompt, max_tokens=5, temperature=0, echo=True, logprobs=2
        )
        c = r.choices[0]
        assert c.text == prompt + plain.choices[0].text  # greedy output unchanged
        lp = c.logprobs
        assert lp is not None and len(lp.tokens) == len(ids) + 5
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing precedes the first token
        got = torch.tensor(lp.token_logprobs[1 : len(ids)])
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        for top, row in zip(lp.top_logprobs[1 : len(ids)], ref, strict=False):
            assert top is not None and len(top) <= 2
            assert max(top.values()) == pytest.approx(row.max().item(), abs=1e-4)
        assert all(x is not None for x in lp.token_logprobs[len(ids) :])  # then the completion's own
        assert lp.text_offset[len(ids)] == len(prompt)


@pytest.fixture(scope="module")
def hf_logprobs(cluster: ApiCluster):  # -> Callable[[list[int]], torch.Tensor]
    """log_softmax of HF transformers' logits over a prompt (row p predicts token p + 1): the ground truth."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(cluster.model_dir, dtype=torch.float32).eval()

    def run(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)

    return run


def _check_vllm_prompt_logprobs(entries: list, ids: list[int], ref, k: int) -> None:  # type: ignore[no-untyped-def]
    """vLLM's shape: one entry per prompt token, None first, then {token id: {logprob, rank, decoded_token}} with
    the prompt token (its rank in the vocabulary) and the k most likely tokens (ranks 1..k)."""
    assert len(entries) == len(ids) and entries[0] is None
    for p, (entry, tid) in enumerate(zip(entries[1:], ids[1:], strict=True)):
        row = ref[p]
        own = entry[str(tid)]
        assert own["logprob"] == pytest.approx(row[tid].item(), abs=1e-4)
        v = row[tid].item()  # rank: tokens at least as likely (within float noise between the engine and HF)
        assert int((row > v + 1e-4).sum()) + 1 <= own["rank"] <= int((row >= v - 1e-4).sum())
        assert isinstance(own["decoded_token"], str)
        tops = sorted((e for e in entry.values() if e["rank"] <= k), key=lambda e: e["rank"])
        assert [e["rank"] for e in tops][:k] == list(range(1, k + 1))
        assert [e["logprob"] for e in tops[:k]] == pytest.approx(row.topk(k).values.tolist(), abs=1e-4)
        assert len(entry) <= k + 1


def test_prompt_logprobs_in_vllm_shape(client: openai.OpenAI, cluster: ApiCluster, hf_logprobs) -> None:
    prompt = "Numbers: 1 2 3 4"
    ids = httpx.post(f"{cluster.http}/tokenize", json={"prompt": prompt}).json()["tokens"]
    plain = client.completions.create(model=openai.NOT_GIVEN, prompt=prompt, max_tokens=5, temperature=0)
    r = client.completions.create(
        model=openai.NOT_GIVEN, prompt=prompt, max_tokens=5, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    assert r.choices[0].text == plain.choices[0].text and r.choices[0].logprobs is None  # greedy output unchanged
    _check_vllm_prompt_logprobs(r.to_dict()["choices"][0]["prompt_logprobs"], ids, hf_logprobs(ids), 2)

    chat_ids = httpx.post(f"{cluster.http}/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    plain_chat = client.chat.completions.create(model=openai.NOT_GIVEN, messages=MESSAGES, max_tokens=4, temperature=0)
    c = client.chat.completions.create(
        model=openai.NOT_GIVEN, messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    assert c.choices[0].message.content == plain_chat.choices[0].message.content
    _check_vllm_prompt_logprobs(c.to_dict()["prompt_logprobs"], chat_ids, hf_logprobs(chat_ids), 1)  # vLLM: top level

    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(
            model=openai.NOT_GIVEN, prompt=prompt, max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1}
        )
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(
            model=openai.NOT_GIVEN, prompt=prompt, max_tokens=2, extra_body={"prompt_logprobs": 21}
        )


def test_prompt_logprobs_over_the_grpc_api(client: openai.OpenAI, cluster: ApiCluster) -> None:
    import grpc

    from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

    prompt = "Numbers: 1 2 3 4"
    http = client.completions.create(
        model=openai.NOT_GIVEN, prompt=prompt, max_tokens=5, temperature=0, echo=True, logprobs=2
    ).to_dict()["choices"][0]
    with grpc.insecure_channel(cluster.grpc) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        sampling = common_pb2.SamplingParams(temperature=0, max_tokens=5, logprobs=True, top_logprobs=2)
        msgs = list(stub.Generate(gateway_pb2.GenerateRequest(text=prompt, sampling=sampling, echo=True), timeout=60))
        only = common_pb2.SamplingParams(temperature=0, max_tokens=5, prompt_logprobs=2)
        plain = list(stub.Generate(gateway_pb2.GenerateRequest(text=prompt, sampling=only), timeout=60))
        two = common_pb2.SamplingParams(temperature=1.0, seed=7, max_tokens=4, n=2, prompt_logprobs=0)
        forked = list(
            stub.Generate(
                gateway_pb2.GenerateRequest(text=prompt, sampling=two, echo=True, return_token_ids=True), timeout=60
            )
        )
        with pytest.raises(grpc.RpcError) as e:
            list(
                stub.Generate(
                    gateway_pb2.GenerateRequest(
                        chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content="hi")]),
                        sampling=only,
                        echo=True,
                    ),
                    timeout=60,
                )
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "".join(m.text for m in msgs) == http["text"]  # echo: the prompt, then the same greedy tokens
    assert "".join(m.text for m in plain) == http["text"][len(prompt) :]
    for got in (msgs, plain):
        first, rest = got[0], got[1:]
        assert all(not m.prompt_logprobs and not m.prompt_token_ids for m in rest)  # the first message only
        assert len(first.prompt_token_ids) == len(first.prompt_logprobs) + 1
        want = http["prompt_logprobs"]
        for entry, lp in zip(want[1:], first.prompt_logprobs, strict=True):
            own = entry[str(lp.token_id)]
            assert lp.logprob == pytest.approx(own["logprob"], abs=1e-5) and lp.rank == own["rank"]
            assert len(lp.top_logprobs) == 2
            assert sorted(t.logprob for t in lp.top_logprobs) == pytest.approx(
                sorted(v["logprob"] for v in entry.values() if v["rank"] <= 2), abs=1e-5
            )
    # n = 2 over gRPC: indexed samples, each echoed and with the prompt logprobs once, as the HTTP API answers
    want = client.completions.create(model=openai.NOT_GIVEN, prompt=prompt, max_tokens=4, temperature=1.0, seed=7, n=2)
    for i in (0, 1):
        mine = [m for m in forked if m.index == i]
        assert "".join(m.text for m in mine) == prompt + want.choices[i].text
        assert sum(len(m.token_ids) for m in mine) == 4 and mine[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert len(mine[0].prompt_logprobs) == len(mine[0].prompt_token_ids) - 1 > 0
    assert forked[-1].usage.completion_tokens == 8 and forked[-1].usage.prompt_tokens == want.usage.prompt_tokens
    # the echoed logprobs of the HTTP answer are the same numbers as the prompt_logprobs list
    assert http["logprobs"]["token_logprobs"][1 : len(msgs[0].prompt_token_ids)] == pytest.approx(
        [lp.logprob for lp in msgs[0].prompt_logprobs], abs=1e-5
    )


def test_non_ascii_choices_regex_and_schema(client: openai.OpenAI) -> None:
    words = ["café", "naïve", "日本"]
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=openai.NOT_GIVEN,
            messages=MESSAGES,
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            extra_body={"structured_outputs": {"choice": words}},
        )
        assert r.choices[0].message.content in words
    c = client.completions.create(
        model=openai.NOT_GIVEN,
        prompt="Mot:",
        max_tokens=12,
        temperature=1.0,
        seed=3,
        extra_body={"structured_outputs": {"regex": "(café|naïve|日本)!"}},
    )
    assert c.choices[0].text in [w + "!" for w in words], c.choices[0].text
    schema = {
        "type": "object",
        "properties": {"mot": {"enum": words}, "名前": {"type": "string", "maxLength": 4}},
        "required": ["mot", "名前"],
        "additionalProperties": False,
    }
    s = client.chat.completions.create(
        model=openai.NOT_GIVEN,
        messages=MESSAGES,
        max_tokens=40,
        temperature=1.0,
        seed=4,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}},
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
    jsonschema.validate(json.loads(text), schema)
