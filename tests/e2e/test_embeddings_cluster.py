"""/v1/embeddings through a real cluster: etcd + NATS + a gateway + encoder processes on the bundled
all-MiniLM-L6-v2, driven by the official `openai` client (and the gateway's gRPC Embed).

Checked: vectors equal the model's (in-process, itself checked against sentence-transformers) for strings, lists
and token ids, in float and base64; OpenAI error bodies for bad input, an over-long input (400 naming the limit)
unless truncation is asked for, unsupported dimensions, unknown models; /v1/models lists the embedding model; two
encoders share the load; an encoder crashing mid-request is retried on another one and the answer is right; a
hung encoder times out within the gateway's --encoder-timeout-s and the request is answered by another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from proto.pdrelay.v1 import gateway_pb2, gateway_pb2_grpc
from services.encoder.embedding import SentenceEmbedder
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import make_tiny_model
from tests.services.disagg.disagg_procs import ServiceProc, Spec, start_services, stop_services, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "embed"
MODEL = "all-minilm-l6-v2"
TIMEOUT_S = 3.0  # the gateway's --encoder-timeout-s


@dataclass
class Cluster:
    tmp: Path
    etcd: object
    nats: object
    model_dir: Path
    procs: dict[str, ServiceProc]

    @property
    def http(self) -> str:
        info = self.procs["gw-1"].ready
        assert info is not None
        return f"http://{info.http}"

    def start(self, spec: Spec) -> ServiceProc:
        p = ServiceProc(spec, self.tmp, self.etcd, self.nats, self.model_dir)  # type: ignore[arg-type]
        self.procs[spec.instance_id] = p
        wait_ready([p])
        return p


def _encoder(iid: str, *args: str) -> Spec:
    return Spec("encoder", iid, CLUSTER, ("--encoder-batch-wait-ms", "2", *args))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("embeddings")
    model_dir = make_tiny_model(tmp / "models", "llama")  # the gateway's generation model (unused here)
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    procs: dict[str, ServiceProc] = {}
    try:
        procs = start_services(
            tmp,
            etcd,
            nats,
            model_dir,
            [
                Spec("gateway", "gw-1", CLUSTER, ("--port", "0", "--encoder-timeout-s", str(TIMEOUT_S))),
                _encoder("enc-1"),
                _encoder("enc-2"),
            ],
        )
        yield Cluster(tmp, etcd, nats, model_dir, procs)
    finally:
        stop_services(procs.values())
        etcd.stop()
        nats.stop()


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> SentenceEmbedder:
    return SentenceEmbedder(minilm_dir, MODEL)


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    from shared.modelspec.bundled import resolve_model_path

    return resolve_model_path(f"bundled:{MODEL}")


def _client(cluster: Cluster):  # -> openai.OpenAI
    import openai

    return openai.OpenAI(base_url=f"{cluster.http}/v1", api_key="unused", max_retries=0, timeout=60)


def _ref(reference: SentenceEmbedder, texts: list[str], cut: int = 0) -> np.ndarray:
    return reference.embed(reference.tokenize(texts, cut)).numpy()


def _wait_encoders(cluster: Cluster, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        models = httpx.get(f"{cluster.http}/v1/models").json()["data"]
        if any(m["id"] == MODEL for m in models):
            return
        time.sleep(0.1)
    raise TimeoutError("the gateway does not list the embedding model")


def test_openai_client_strings_lists_and_formats(cluster: Cluster, reference: SentenceEmbedder) -> None:
    _wait_encoders(cluster, 2)
    client = _client(cluster)
    texts = ["What is the capital of France?", "Ünïcödé 東京 🙂", "a"]
    # the openai client asks for base64 by default and decodes it
    r = client.embeddings.create(model=MODEL, input=texts)
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    assert got.shape == (3, 384) and [d.index for d in r.data] == [0, 1, 2]
    np.testing.assert_allclose(got, _ref(reference, texts), atol=1e-6)
    assert r.model == MODEL and r.usage.prompt_tokens == r.usage.total_tokens == sum(
        len(x) for x in reference.tokenize(texts)
    )
    one = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    np.testing.assert_allclose(np.array(one.data[0].embedding, dtype=np.float32), got[0], atol=1e-6)
    ids = reference.tokenize(texts[:2])
    by_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    np.testing.assert_allclose(np.array([d.embedding for d in by_ids.data], dtype=np.float32), got[:2], atol=1e-6)
    single_ids = client.embeddings.create(model=MODEL, input=ids[0])  # a flat list of ints is one input
    assert len(single_ids.data) == 1
    models = [m.id for m in client.models.list().data]
    assert MODEL in models


def test_bad_input_gets_openai_errors(cluster: Cluster) -> None:
    import openai

    client = _client(cluster)
    with pytest.raises(openai.BadRequestError, match="takes at most 256 tokens"):
        client.embeddings.create(model=MODEL, input=["fine", "long " * 300])
    with pytest.raises(openai.BadRequestError, match="empty string"):
        client.embeddings.create(model=MODEL, input="")
    with pytest.raises(openai.BadRequestError, match="dimensions 100 is not supported"):
        client.embeddings.create(model=MODEL, input="x", dimensions=100)
    with pytest.raises(openai.NotFoundError, match="not an embedding model"):
        client.embeddings.create(model="nope", input="x")
    cut = client.embeddings.create(model=MODEL, input="long " * 300, extra_body={"truncate_prompt_tokens": -1})
    assert cut.usage.prompt_tokens == 256
    for body in (
        {"model": MODEL, "input": ["a", [1, 2]]},
        {"model": MODEL, "input": [[]]},
        {"model": MODEL, "input": "x", "encoding_format": "int8"},
        {"model": MODEL, "input": [-1]},
        {"model": MODEL, "input": "x", "truncate_prompt_tokens": 999},
        {"model": MODEL},
    ):
        resp = httpx.post(f"{cluster.http}/v1/embeddings", json=body)
        assert resp.status_code == 400, (body, resp.text)
        err = resp.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], body
    resp = httpx.post(f"{cluster.http}/v1/embeddings", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"


def test_grpc_embed(cluster: Cluster, reference: SentenceEmbedder) -> None:
    info = cluster.procs["gw-1"].ready
    assert info is not None

    async def call() -> gateway_pb2.EmbeddingsResponse:
        async with grpc.aio.insecure_channel(info.grpc) as ch:
            stub = gateway_pb2_grpc.GatewayStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Embed(gateway_pb2.EmbeddingsRequest(model=MODEL, texts=["long " * 300]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "256" in (e.value.details() or "")
            return await stub.Embed(gateway_pb2.EmbeddingsRequest(texts=["hello world", "second"]))

    r = asyncio.run(call())
    got = np.array([list(d.values) for d in r.data], dtype=np.float32)
    np.testing.assert_allclose(got, _ref(reference, ["hello world", "second"]), atol=1e-6)
    assert r.model == MODEL and r.usage.prompt_tokens > 0


def _served(cluster: Cluster, iid: str) -> float:
    info = cluster.procs[iid].ready
    assert info is not None and info.metrics
    text = httpx.get(f"http://{info.metrics}/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("pdrelay:encoder_inputs_total"))
    return float(line.split()[-1])


def test_concurrent_requests_share_the_encoders(cluster: Cluster, reference: SentenceEmbedder) -> None:
    before = {i: _served(cluster, i) for i in ("enc-1", "enc-2")}
    texts = [f"sentence number {i} about serving" for i in range(32)]

    async def run() -> list[list[float]]:
        async with httpx.AsyncClient(base_url=cluster.http, timeout=60) as c:
            rs = await asyncio.gather(*(c.post("/v1/embeddings", json={"model": MODEL, "input": t}) for t in texts))
        return [r.json()["data"][0]["embedding"] for r in rs]

    got = np.array(asyncio.run(run()), dtype=np.float32)
    np.testing.assert_allclose(got, _ref(reference, texts), atol=1e-6)
    served = {i: _served(cluster, i) - before[i] for i in before}
    assert sum(served.values()) == 32 and min(served.values()) >= 4, served  # both took a share


def _until_hit(cluster: Cluster, reference: SentenceEmbedder, hit: callable, tries: int = 8) -> list[float]:  # type: ignore[valid-type]
    """Sequential requests (idle encoders take turns) until `hit()` says the faulty encoder got one; every answer
    must be right. Returns the latencies."""
    client = _client(cluster)
    took: list[float] = []
    for i in range(tries):
        text = f"request {i} to a faulty cluster"
        t0 = time.monotonic()
        r = client.embeddings.create(model=MODEL, input=text, encoding_format="float")
        took.append(time.monotonic() - t0)
        np.testing.assert_allclose(
            np.array(r.data[0].embedding, dtype=np.float32), _ref(reference, [text])[0], atol=1e-6
        )
        if hit():
            return took
    raise AssertionError(f"the faulty encoder got none of {tries} requests")


def test_encoder_crash_mid_request_is_retried_elsewhere(cluster: Cluster, reference: SentenceEmbedder) -> None:
    bad = cluster.start(_encoder("enc-crash", "--encoder-fault-injection", "encoder_crash"))
    _until_hit(cluster, reference, lambda: not bad.alive())
    assert bad.proc.wait(10) == 137  # it died (as a SIGKILLed process reports), and the request still answered


def test_encoder_hang_times_out_and_is_retried(cluster: Cluster, reference: SentenceEmbedder) -> None:
    bad = cluster.start(_encoder("enc-hang", "--encoder-fault-injection", "encoder_hang"))
    try:
        took = _until_hit(cluster, reference, lambda: "stalling" in bad.log())
        assert TIMEOUT_S <= max(took) < TIMEOUT_S + 10  # the gateway's deadline ended the hung call
    finally:
        stop_services([bad], timeout=5)


def test_registration_health_load_and_metrics(cluster: Cluster) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from shared.cluster.status import collect_status

    info = cluster.procs["enc-1"].ready
    assert info is not None

    async def check() -> None:
        async with grpc.aio.insecure_channel(info.grpc) as ch:
            h = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="pdrelay.v1.Encoder"))
            assert h.status == health_pb2.HealthCheckResponse.SERVING
        st = await collect_status(cluster.etcd.url, cluster.nats.url, CLUSTER)  # type: ignore[attr-defined]
        rows = {r.instance_id: r for r in st.rows if r.role == "encoder"}
        assert {"enc-1", "enc-2"} <= set(rows)
        assert rows["enc-1"].model == MODEL and rows["enc-1"].load is not None  # load reports over NATS

    asyncio.run(check())
    from shared.cluster.instance import Modality

    async def registered():  # -> InstanceInfo
        from shared.cluster.etcd import connect_etcd
        from shared.cluster.membership import Membership

        client = await connect_etcd([cluster.etcd.url])  # type: ignore[attr-defined]
        try:
            async with Membership(client, CLUSTER) as m:
                return next(i for i in m.instances("encoder") if i.instance_id == "enc-1")
        finally:
            await client.close()

    reg = asyncio.run(registered())
    assert reg.encoder is not None and reg.encoder.modalities == (Modality.EMBEDDING,)
    assert (reg.encoder.embedding_model, reg.encoder.embedding_dim, reg.encoder.max_seq_len) == (MODEL, 384, 256)
    assert reg.capacity.max_running_requests > 0
    text = httpx.get(f"http://{info.metrics}/metrics").text
    for name in (
        'pdrelay:encoder_request_latency_seconds_count{kind="embed"}',
        "pdrelay:encoder_batch_size_count",
        "pdrelay:encoder_forward_seconds_count",
        "pdrelay:encoder_cache_hits_total",
    ):
        assert name in text, name
    count = next(ln for ln in text.splitlines() if ln.startswith("pdrelay:encoder_request_latency_seconds_count"))
    assert float(count.split()[-1]) > 0


def test_sigterm_drains_an_encoder_after_its_request(cluster: Cluster, reference: SentenceEmbedder) -> None:
    import signal

    from proto.pdrelay.v1 import worker_pb2, worker_pb2_grpc

    enc = cluster.procs["enc-2"]
    texts = [f"a long sentence number {i} " * 20 for i in range(32)]

    async def run() -> worker_pb2.EmbedResponse:
        async with grpc.aio.insecure_channel(enc.grpc) as ch:
            call = worker_pb2_grpc.EncoderStub(ch).Embed(worker_pb2.EmbedRequest(texts=texts), timeout=120)
            await asyncio.sleep(0.3)  # the request is in flight
            enc.proc.send_signal(signal.SIGTERM)
            return await call

    resp = asyncio.run(run())
    assert resp.instance_id == "enc-2" and list(resp.embeddings.shape) == [32, 384]
    got = np.frombuffer(resp.embeddings.data, dtype="<f4").reshape(32, 384)
    np.testing.assert_allclose(got[:4], _ref(reference, texts[:4]), atol=1e-6)
    assert enc.proc.wait(30) == 0
    assert "draining (SIGTERM), 1 in flight" in enc.log()
