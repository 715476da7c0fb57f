"""Every sampling parameter through a served cluster with the official `openai` client, colocated (one worker) and
disaggregated (prefill + decode over NIXL): 200 and the in-process engine's greedy tokens for each; and a request
whose own processing fails (the request_poison fault, before its first token and mid-stream) fails alone: the
ordinary requests in flight beside it complete with their normal output, the gateway neither retries it nor opens
a circuit breaker, and the cluster serves on."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from shared.engine.sampler.sampler import POISON_STOP
from tests.helpers.cluster_procs import TOPOLOGIES, ApiCluster, api_cluster
from tests.helpers.tiny_models import make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": PROMPT}]
MAX_TOKENS = 10
# (name, extra request fields): every OpenAI / vLLM sampling parameter the engine applies
CASES = [
    ("plain", {}),
    ("logit_bias", {"logit_bias": {"77": 100}}),
    ("logit_bias_ban", {"logit_bias": {"40": -100, "41": 5}}),
    ("frequency_penalty", {"frequency_penalty": 1.5}),
    ("presence_penalty", {"presence_penalty": 1.5}),
    ("repetition_penalty", {"repetition_penalty": 1.8}),
    ("min_tokens", {"min_tokens": 6, "ignore_eos": False}),
    ("stop_token_ids", {"stop_token_ids": [90, 91]}),
    ("all_at_once", {"logit_bias": {"41": 2}, "frequency_penalty": 0.5, "repetition_penalty": 1.3, "min_tokens": 2}),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("sampling-models"), "llama")


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def cluster(
    request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiCluster]:
    extra = ("--fault-injection", "request_poison")
    with api_cluster(request.param, model_dir, tmp_path_factory.mktemp(f"sampling-{request.param}"), extra=extra) as c:
        deadline = time.monotonic() + 60
        while httpx.get(f"{c.http}/ready").status_code != 200:
            assert time.monotonic() < deadline, c.logs()
            time.sleep(0.2)
        yield c


@pytest.fixture(scope="module")
def client(cluster: ApiCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.http}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):  # -> GatewayTokenizer
    from services.gateway.text.tokenizer import GatewayTokenizer

    return GatewayTokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir: Path, tokenizer):  # -> Callable[[dict], bytes]
    """The bytes of the in-process engine's greedy tokens for the same chat prompt and parameters (the ground
    truth). The random model's tokens are mostly pieces of characters, so answers are compared as the exact bytes
    of their tokens (the chat API's logprobs carry them), not as text."""
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.modelspec.sampling import SamplingParams

    engine = Engine.from_config(
        resolve(
            "worker", ["--model", str(model_dir), "--num-pages", "512", "--threads", "1", "--dtype", "float32"], env={}
        )
    )
    prompt = tokenizer.encode_chat(MESSAGES)

    def run(fields: dict) -> bytes:
        kw = {k: v for k, v in fields.items() if k != "logit_bias"}
        kw.setdefault("ignore_eos", True)
        bias = {int(k): float(v) for k, v in fields.get("logit_bias", {}).items()}
        sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=bias, **kw)
        return b"".join(tokenizer.token_bytes(t) for t in engine.generate([prompt], sp)[0].token_ids)

    return run


def _answer_bytes(logprobs) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(bytes(t.bytes) for t in logprobs)


def _metric(cluster: ApiCluster, name: str) -> float:
    body = httpx.get(f"{cluster.http}/metrics").text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", body, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


@pytest.mark.parametrize(("name", "fields"), CASES, ids=[c[0] for c in CASES])
def test_each_sampling_parameter_is_served_as_the_engine_computes_it(
    client: openai.OpenAI, cluster: ApiCluster, reference, name: str, fields: dict
) -> None:
    want = reference(fields)
    kw = {"model": cluster.model_dir.name, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
    body = {"ignore_eos": True, **fields}
    r = client.chat.completions.create(**kw, logprobs=True, extra_body=body)
    assert r.choices[0].logprobs is not None
    assert _answer_bytes(r.choices[0].logprobs.content) == want, f"{cluster.topology} {name}"
    chunks = client.chat.completions.create(**kw, logprobs=True, stream=True, extra_body=body)
    streamed = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content or ()]
    assert _answer_bytes(streamed) == want, f"{cluster.topology} {name} streamed"


def test_seeded_sampling_and_n_are_served(client: openai.OpenAI, cluster: ApiCluster) -> None:
    kw = {"model": cluster.model_dir.name, "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 7}
    # Both draws below then find the same prompt pages in the prefix cache: a prefill over a cached prefix runs
    # other kernels than a whole one, and at temperature 1 a last-bit difference in a logit can flip a draw.
    client.completions.create(**{**kw, "max_tokens": 1, "temperature": 0})
    a = client.completions.create(**kw, extra_body={"logit_bias": {"41": 3}, "presence_penalty": 0.5})
    b = client.completions.create(**kw, extra_body={"logit_bias": {"41": 3}, "presence_penalty": 0.5})
    assert a.choices[0].text == b.choices[0].text
    r = client.completions.create(**{**kw, "seed": None}, n=3, extra_body={"frequency_penalty": 0.7})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in r.choices)
    chat = client.chat.completions.create(
        model=cluster.model_dir.name,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=30,
        temperature=0,
        logit_bias={"41": 2},
        frequency_penalty=0.4,
        extra_body={"structured_outputs": {"choice": ["alpha", "beta"]}},
    )
    assert chat.choices[0].message.content in ("alpha", "beta")


@pytest.mark.parametrize("at", ["", "@1"], ids=["before-first-token", "mid-stream"])
def test_a_failing_request_fails_alone(cluster: ApiCluster, reference, at: str) -> None:
    """Six ordinary requests in flight plus one that fails in its own logits processing: the six complete with
    their normal output, the failing one gets an OpenAI error naming why, and no breaker opens."""
    retries = _metric(cluster, "pdrelay:gateway_retries_total")
    want = reference({"logit_bias": {"41": 2}})

    async def run() -> list[object]:
        async with httpx.AsyncClient(base_url=cluster.http, timeout=60) as http:

            async def ordinary(i: int) -> bytes:
                body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
                r = await http.post("/v1/chat/completions", json={**body, "logit_bias": {"41": 2}, "logprobs": True})
                assert r.status_code == 200, r.text
                return b"".join(bytes(t["bytes"]) for t in r.json()["choices"][0]["logprobs"]["content"])

            async def poisoned() -> httpx.Response:
                await asyncio.sleep(0.05)  # arrives while the others run
                body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "stop": [POISON_STOP + at]}
                return await http.post("/v1/chat/completions", json=body)

            return await asyncio.gather(*(ordinary(i) for i in range(6)), poisoned())

    *answers, bad = asyncio.run(run())
    assert answers == [want] * 6, cluster.logs()
    assert isinstance(bad, httpx.Response)
    assert bad.status_code == 500, bad.text  # after its first token too: a non-streamed answer is one error body
    err = bad.json()["error"]
    assert err["code"] == "request_failed" and "fault injection request_poison" in err["message"], err
    assert _metric(cluster, "pdrelay:gateway_retries_total") == retries  # not retried elsewhere
    assert 'pdrelay:gateway_circuit_breakers{state="open"} 0.0' in httpx.get(f"{cluster.http}/metrics").text
    r = httpx.post(
        f"{cluster.http}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_a_stream_that_fails_mid_way_ends_with_an_error_event(cluster: ApiCluster) -> None:
    body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "stop": [POISON_STOP + "@3"]}
    body |= {"stream": True, "logprobs": True}  # logprobs: each token goes out, whole characters or not
    with httpx.stream("POST", f"{cluster.http}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "request_poison" in events[-1]["error"]["message"], events
    sent = [t for e in events[:-1] for c in e["choices"] if c.get("logprobs") for t in c["logprobs"]["content"]]
    assert len(sent) == 3  # the tokens before the failure went out


def test_the_grpc_api_names_a_request_failure(cluster: ApiCluster) -> None:
    """On the gateway's gRPC API: logit_bias and penalties are served; a failed request is REQUEST_FAILED."""
    import grpc

    from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
    from shared.cluster.grpc_errors import error_from_rpc

    with grpc.insecure_channel(cluster.grpc) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        biased = common_pb2.SamplingParams(
            temperature=0, max_tokens=6, ignore_eos=True, logit_bias={77: 100.0}, frequency_penalty=0.5
        )
        msgs = list(stub.Generate(gateway_pb2.GenerateRequest(text=PROMPT, sampling=biased, return_token_ids=True)))
        assert [t for m in msgs for t in m.token_ids] == [77] * 6
        poison = common_pb2.SamplingParams(temperature=0, max_tokens=6, stop=[POISON_STOP])
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(gateway_pb2.GenerateRequest(text=PROMPT, sampling=poison), timeout=60))
        err = error_from_rpc(e.value)
        assert err is not None and err.code == common_pb2.ERROR_CODE_REQUEST_FAILED, e.value
