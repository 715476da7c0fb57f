"""The gateway process as a lifecycle service, without a model: real etcd + NATS + `python -m services.gateway`, and
decode "workers" that are fake Decode servers in this test process registered in etcd like real ones.

Checked: ready line and etcd registration carry the HTTP address; /ready and requests answer 503 + Retry-After
until a worker registers; overload becomes 429 + Retry-After; a busy HTTP port is a clear startup error (exit 2);
SIGTERM drains: the listener closes, a running stream finishes, the process exits 0 and deregisters.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from shared.cluster.etcd import connect_etcd
from shared.cluster.grpc_errors import abort
from shared.cluster.instance import Capacity, InstanceInfo, InstanceState, decode_instance, instance_key
from shared.cluster.localcluster.servers import EtcdServer, NatsServer
from shared.cluster.localcluster.service_process import OFFLINE_ENV, ServiceProcess
from shared.cluster.registration import Registrar
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "gwsvc"
TOKENS = [70, 71, 72, 73]  # byte-level alphabet tokens of the tiny tokenizer: each decodes to one character


@dataclass
class Env:
    etcd: EtcdServer
    nats: NatsServer
    model_dir: Path
    tmp: Path
    gateway: ServiceProcess

    @property
    def http(self) -> str:
        assert self.gateway.ready is not None
        return f"http://{self.gateway.ready.http}"


def _gateway_cmd(env_etcd: EtcdServer, nats: NatsServer, model_dir: Path, iid: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "services.gateway",
        "--etcd-endpoints",
        env_etcd.url,
        "--nats-url",
        nats.url,
        "--cluster",
        CLUSTER,
        "--instance-id",
        iid,
        "--model",
        str(model_dir),
        "--lease-ttl-s",
        "2",
        *extra,
    ]


def _start_gateway(name: str, cmd: list[str], tmp: Path, timeout: float = 60.0) -> ServiceProcess:
    gw = ServiceProcess(name, cmd, tmp)  # the ready handshake: one JSON line on stdout
    try:
        return gw.wait_ready(timeout)
    except BaseException:
        gw.stop()
        raise


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("gateway-service")
    model_dir = make_tiny_model(tmp / "models", "llama")
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    gw: ServiceProcess | None = None
    try:
        gw = _start_gateway(
            "gw-1", _gateway_cmd(etcd, nats, model_dir, "gw-1", "--port", "0", "--drain-timeout-s", "20"), tmp
        )
        yield Env(etcd, nats, model_dir, tmp, gw)
    finally:
        if gw is not None:
            gw.stop()
        etcd.stop()
        nats.stop()


@dataclass
class FakeWorker(worker_pb2_grpc.DecodeServicer):
    refuse: int = 0
    token_delay_s: float = 0.0
    served: int = 0
    finished: int = 0
    server: grpc.aio.Server | None = None
    registrar: Registrar | None = None

    async def Generate(
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.DecodeResponse]:
        if self.refuse:
            await abort(context, self.refuse, "fake worker refuses", instance_id="fake-1")
        self.served += 1
        n = request.sampling.max_tokens
        for i in range(n):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            msg = worker_pb2.DecodeResponse(request_id=request.request_id, token_ids=[TOKENS[i % len(TOKENS)]])
            if i == n - 1:
                msg.finish_reason = common_pb2.FINISH_REASON_LENGTH
                msg.usage.CopyFrom(common_pb2.Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=n))
            yield msg
        self.finished += 1


@pytest.fixture
async def worker(env: Env) -> AsyncIterator[FakeWorker]:
    """A fake worker, registered READY in etcd under the gateway's model name (unregistered at the end)."""
    fake = FakeWorker()
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = await connect_etcd([env.etcd.url])
    reg = Registrar(
        client,
        InstanceInfo(
            cluster=CLUSTER,
            role="worker",
            instance_id="fake-1",
            grpc_address=f"127.0.0.1:{port}",
            state=InstanceState.READY,
            model=env.model_dir.name,
            capacity=Capacity(max_running_requests=8, num_pages=100, page_size=16),
        ),
        ttl_s=2,
    )
    fake.server, fake.registrar = server, reg
    try:
        yield fake
    finally:
        await reg.deregister()
        await client.close()
        await server.stop(None)


async def _register(fake: FakeWorker, c: httpx.AsyncClient) -> None:
    assert fake.registrar is not None
    await fake.registrar.register()
    deadline = time.monotonic() + 5
    while (await c.get("/ready")).status_code != 200:
        assert time.monotonic() < deadline, "the gateway did not see the registered worker"
        await asyncio.sleep(0.05)


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


async def test_ready_line_registration_and_readiness(env: Env, worker: FakeWorker) -> None:
    ready = env.gateway.ready
    assert ready.role == "gateway" and ready.http and ready.grpc
    client = await connect_etcd([env.etcd.url])
    try:
        assert client.kv is not None
        got = await client.kv.get(instance_key(CLUSTER, "gateway", "gw-1"))
        info = decode_instance(got.kvs[0].value)
    finally:
        await client.close()
    assert info.http_address == ready.http and info.state == InstanceState.READY
    assert info.model == env.model_dir.name
    async with httpx.AsyncClient(base_url=env.http, timeout=10) as c:
        r = await c.get("/ready")
        assert r.status_code == 503 and r.headers.get("retry-after")
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.headers.get("retry-after"), r.text
        assert "no instance serving" in r.json()["error"]["message"]
        await _register(worker, c)
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(env.model_dir))
        assert r.json()["choices"][0]["message"]["content"] == tok.decode([TOKENS[i % 4] for i in range(6)])
        metrics = (await c.get("/metrics")).text
        assert 'pdrelay:gateway_instances_ready{role="worker"} 1.0' in metrics
        assert "pdrelay:time_to_first_token_seconds_count" in metrics


async def test_overloaded_workers_give_429(env: Env, worker: FakeWorker) -> None:
    worker.refuse = common_pb2.ERROR_CODE_OVERLOADED
    async with httpx.AsyncClient(base_url=env.http, timeout=10) as c:
        await _register(worker, c)
        r = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
    assert r.json()["error"]["code"] == "overloaded"


def test_busy_http_port_is_a_clear_startup_error(env: Env) -> None:
    port = env.gateway.ready.http.rsplit(":", 1)[1]
    cmd = _gateway_cmd(env.etcd, env.nats, env.model_dir, "gw-2", "--port", port)
    proc = subprocess.run(cmd, capture_output=True, timeout=60, env={**os.environ, **OFFLINE_ENV})
    assert proc.returncode == 2, proc.stderr.decode()[-2000:]
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in proc.stderr.decode() and "--port" in proc.stderr.decode()


async def test_sigterm_drains_streams_then_exits_0(env: Env, worker: FakeWorker) -> None:
    worker.token_delay_s = 0.02
    n = 60  # ~1.2 s of streaming
    async with httpx.AsyncClient(base_url=env.http, timeout=30) as c:
        await _register(worker, c)
        async with c.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": n, "stream": True}) as s:
            lines = s.aiter_lines()
            seen = [await anext(lines)]
            while not seen[-1].startswith("data: {"):
                seen.append(await anext(lines))
            env.gateway.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            with pytest.raises(httpx.ConnectError):  # the listener is closed: new clients go elsewhere
                async with httpx.AsyncClient(base_url=env.http, timeout=2) as fresh:
                    await fresh.get("/health")
            seen += [line async for line in lines]
    events = [json.loads(line[6:]) for line in seen if line.startswith("data: {")]
    assert "data: [DONE]" in seen
    assert len("".join(e["choices"][0]["delta"].get("content") or "" for e in events)) == n, "a token went missing"
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    deadline = time.monotonic() + 3
    while worker.finished < 1 and time.monotonic() < deadline:  # the worker resumes after its last message is out
        await asyncio.sleep(0.02)
    assert worker.finished == worker.served == 1, "the stream ran to its end on the worker, not cancelled"
    assert await asyncio.to_thread(env.gateway.proc.wait, 20) == 0, env.gateway.log()[-3000:]
    client = await connect_etcd([env.etcd.url])
    try:
        assert client.kv is not None
        assert not (await client.kv.get(instance_key(CLUSTER, "gateway", "gw-1"))).kvs, "still registered"
    finally:
        await client.close()
