"""The colocated worker at --tp-size 2 (two processes, gloo on cpu) through a real cluster (etcd, NATS, gateway)
with the official `openai` client: each prompt's greedy answer, plain and streamed, is the same bytes as the
in-process engine at TP=1 on the same weights, with several requests in flight at once (continuous batching over
the two ranks)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.cluster_procs import ApiCluster, api_cluster
from tests.helpers.tiny_models import make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPTS = [
    "The quick brown fox jumps over",
    "A paged KV cache stores",
    "def add(a, b):",
    "Numbers: 0 1 2 3",
    "user assistant system: hello, how are you today?",
    "Prefill computes the prompt; decode produces",
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tp-models"), "qwen2")


@pytest.fixture(scope="module")
def cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiCluster]:
    with api_cluster("colocated", model_dir, tmp_path_factory.mktemp("tp-worker"), extra=("--tp-size", "2")) as c:
        deadline = time.monotonic() + 90
        while httpx.get(f"{c.http}/ready").status_code != 200:
            assert time.monotonic() < deadline, c.logs()
            time.sleep(0.2)
        yield c


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):  # -> GatewayTokenizer
    from services.gateway.text.tokenizer import GatewayTokenizer

    return GatewayTokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir: Path, tokenizer) -> list[bytes]:
    """The TP=1 engine's greedy answer to each chat prompt, as the bytes of its tokens."""
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.modelspec.sampling import SamplingParams

    engine = Engine.from_config(
        resolve("worker", ["--model", str(model_dir), "--num-pages", "512", "--threads", "1"], env={})
    )
    prompts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    got = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    return [b"".join(tokenizer.token_bytes(t) for t in c.token_ids) for c in got]


def _ask(client: openai.OpenAI, model: str, prompt: str, stream: bool) -> bytes:
    kw = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS}
    body = {"ignore_eos": True}
    if stream:
        chunks = client.chat.completions.create(**kw, temperature=0, logprobs=True, stream=True, extra_body=body)
        return b"".join(
            bytes(t.bytes) for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content or ()
        )
    r = client.chat.completions.create(**kw, temperature=0, logprobs=True, extra_body=body)
    assert r.choices[0].logprobs is not None
    return b"".join(bytes(t.bytes) for t in r.choices[0].logprobs.content or ())


def _children(pid: int) -> list[str]:
    """Command lines of the processes whose parent is `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            continue
    return out


def test_the_worker_runs_two_ranks(cluster: ApiCluster) -> None:
    worker = next(p for p in cluster.procs if p.name == "worker-1")
    followers = [c for c in _children(worker.pid) if "shared.engine.parallel.follower" in c]
    assert len(followers) == 1 and '"rank": 1, "size": 2' in followers[0]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_tp2_worker_answers_as_tp1(cluster: ApiCluster, reference: list[bytes], stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{cluster.http}/v1", api_key="none", max_retries=0, timeout=120)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # all in flight together: batched steps on both ranks
        answers = list(pool.map(lambda p: _ask(client, cluster.model_dir.name, p, stream), PROMPTS))
    assert answers == reference, cluster.logs()
