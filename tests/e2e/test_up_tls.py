"""`pdrelay up --tls --api-key K` end to end (bundled model, real processes): the official openai client over HTTPS
with the key, a gRPC client with the key over TLS; refused without the key, with a wrong key, without trusting the
cluster CA, or with a certificate of another CA; etcd and NATS are TLS too (`pdrelay status` still reads them), and
an unsigned scale request is refused by the supervisor. Bad bodies (deep JSON, text/plain) get 400 / 415."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from proto.pdrelay.v1 import gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc
from shared.cluster.bus.client import Bus
from shared.cluster.bus.scale import request_scale
from shared.cluster.certs import make_certs
from shared.cluster.localcluster.rundir import RunState, client_tls, read_state
from shared.cluster.localcluster.servers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

KEY = "test-key-1"
QUESTION = "What is the capital of France?"


def pdrelay(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, check=False, timeout=timeout
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunState]:
    run_dir = tmp_path_factory.mktemp("up-tls") / "run"
    up = pdrelay(
        "up",
        "--detach",
        "--quiet",
        "--tls",
        "--api-key",
        KEY,
        "--run-dir",
        str(run_dir),
        "--cluster",
        "tls",
        "--port",
        str(free_port()),
        "--etcd-port",
        str(free_port()),
        "--nats-port",
        str(free_port()),
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        state = read_state(run_dir)
        assert state is not None and state.tls_dir
        yield state
    finally:
        pdrelay("down", "--run-dir", str(run_dir), timeout=120)


def _child(state: RunState, role: str) -> tuple[str, str]:
    c = next(c for c in state.children if c.role == role)
    return c.http, c.grpc


def _ca(state: RunState) -> str:
    return str(Path(state.tls_dir) / "ca.pem")


def test_openai_client_over_https_with_the_key(cluster: RunState) -> None:
    http, _ = _child(cluster, "gateway")
    assert cluster.etcd_url.startswith("https://") and cluster.nats_url.startswith("tls://")
    client = openai.OpenAI(base_url=f"https://{http}/v1", api_key=KEY, http_client=httpx.Client(verify=_ca(cluster)))
    model = client.models.list().data[0].id
    answer = client.chat.completions.create(
        model=model, max_tokens=16, temperature=0, messages=[{"role": "user", "content": QUESTION}]
    )
    text = answer.choices[0].message.content or ""
    assert "Paris" in text, text
    stream = client.chat.completions.create(
        model=model, max_tokens=16, temperature=0, stream=True, messages=[{"role": "user", "content": QUESTION}]
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text  # greedy: the same
    for bad in ("wrong-key", ""):
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url=f"https://{http}/v1",
                api_key=bad or "x",
                http_client=httpx.Client(verify=_ca(cluster), headers={} if bad else {"Authorization": ""}),
            ).models.list()
    with pytest.raises(openai.APIConnectionError):  # a client that does not trust the cluster CA
        openai.OpenAI(base_url=f"https://{http}/v1", api_key=KEY, max_retries=0).models.list()
    with httpx.Client(
        base_url=f"https://{http}", verify=_ca(cluster), headers={"Authorization": f"Bearer {KEY}"}
    ) as c:  # bad bodies: 4xx, never a 500
        deep = b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"
        r = c.post("/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
        r = c.post(
            "/v1/chat/completions",
            content=b'{"messages": [{"role": "user", "content": "hi"}]}',
            headers={"content-type": "text/plain"},
        )
        assert r.status_code == 415, r.text
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the HTTPS port
        httpx.get(f"http://{http}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)


async def test_grpc_client_with_the_key_over_tls(cluster: RunState) -> None:
    _, address = _child(cluster, "gateway")
    creds = grpc.ssl_channel_credentials(Path(_ca(cluster)).read_bytes())
    req = gateway_pb2.GenerateRequest(
        chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content=QUESTION)])
    )
    req.sampling.max_tokens, req.sampling.temperature, req.sampling.skip_special_tokens = 16, 0.0, True
    async with grpc.aio.secure_channel(address, creds) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        text = "".join([m.text async for m in stub.Generate(req, metadata=(("authorization", f"Bearer {KEY}"),))])
        assert "Paris" in text, text
        for metadata in ((), (("authorization", "Bearer nope"),)):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ListModels(gateway_pb2.ListModelsRequest(), metadata=metadata)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_services_refuse_clients_without_a_cluster_certificate(cluster: RunState, tmp_path: Path) -> None:
    make_certs(tmp_path, ("gateway",))  # another CA
    _, decode = _child(cluster, "decode")
    ca = Path(_ca(cluster)).read_bytes()
    channels = {
        "plaintext": grpc.aio.insecure_channel(decode),
        "no client certificate": grpc.aio.secure_channel(decode, grpc.ssl_channel_credentials(ca)),
        "another CA's certificate": grpc.aio.secure_channel(
            decode,
            grpc.ssl_channel_credentials(
                ca, (tmp_path / "gateway-key.pem").read_bytes(), (tmp_path / "gateway.pem").read_bytes()
            ),
        ),
    }
    for what, ch in channels.items():
        async with ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await (
                    worker_pb2_grpc.DecodeStub(ch).Generate(worker_pb2.DecodeRequest(request_id="x"), timeout=10).read()
                )
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, what


async def test_status_reads_tls_etcd_and_unsigned_scale_is_refused(cluster: RunState) -> None:
    status = await asyncio.to_thread(pdrelay, "status", "--run-dir", cluster.run_dir)
    assert status.returncode == 0, status.stderr
    assert "decode-1" in status.stdout and "ready" in status.stdout
    async with Bus(cluster.nats_url, name="t", tls=client_tls(cluster)) as bus:
        reply = await request_scale(bus, cluster.cluster, {"prefill": 0})
    assert not reply.ok and "not signed" in reply.message
    again = read_state(Path(cluster.run_dir))
    assert again is not None and sum(c.role == "prefill" for c in again.children) == 1
