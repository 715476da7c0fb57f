"""The gateway over a real cluster: etcd + NATS + the gateway (`python -m services.gateway`) + two model instances on
a tiny model, all real processes, in two topologies: two colocated workers (`services.worker`), and two decode
instances with one prefill instance (`services.decode`, `services.prefill`: disaggregated, KV hand-off over NIXL).

Checked: chat (streaming and not) gives exactly the greedy output of the engine run in this process; a repeated
prompt is routed to the worker holding its prefix (KV events -> KV index); the gRPC API; unknown models; a client
disconnect aborts the request on the worker (its load report's running count drops) and publishes a NATS cancel;
a worker (decode) SIGKILLed mid-stream leaves the client with one complete, correct stream (replay on the other).
The kill test runs last in each topology: it leaves one instance.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from shared.cluster.bus.cancel import Cancel, subscribe_cancel
from shared.cluster.bus.client import Bus, Meta
from shared.cluster.bus.kv_events import KVEventBatch, KVOpKind, subscribe_kv_events
from shared.cluster.bus.load import LoadTable
from shared.cluster.localcluster.servers import EtcdServer, NatsServer
from shared.cluster.localcluster.service_process import ServiceProcess, python_cmd, stop_all, wait_all_ready
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "gwtest"
CONTEXT = 16384  # the tiny model is fast: long streams give a kill / disconnect time to land mid-stream
READY_TIMEOUT_S = 90.0
MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@dataclass
class Cluster:
    topology: str
    model_dir: Path
    etcd: EtcdServer
    nats: NatsServer
    workers: dict[str, ServiceProcess]  # the instances the gateway calls (workers, or decodes)
    others: list[ServiceProcess]  # prefill instances
    gateway: ServiceProcess

    @property
    def http(self) -> str:
        assert self.gateway.ready is not None
        return f"http://{self.gateway.ready.http}"

    def logs(self) -> str:
        return "\n".join(
            f"----- {p.name}\n{p.log()[-3000:]}" for p in (*self.workers.values(), *self.others, self.gateway)
        )


def _spawn(name: str, module: str, args: list[str], tmp: Path) -> ServiceProcess:
    return ServiceProcess(name, python_cmd(module, *args), tmp)


def _long_context_model(tmp: Path) -> Path:
    model_dir = make_tiny_model(tmp, "llama")
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["max_position_embeddings"] = CONTEXT
    cfg_path.write_text(json.dumps(cfg))
    return model_dir


TOPOLOGIES = {"colocated": (("worker", 2),), "disaggregated": (("prefill", 1), ("decode", 2))}


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    topology = request.param
    tmp = tmp_path_factory.mktemp(f"gateway-{topology}")
    model_dir = _long_context_model(tmp / "models")
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    common = [
        "--etcd-endpoints",
        etcd.url,
        "--nats-url",
        nats.url,
        "--cluster",
        CLUSTER,
        "--lease-ttl-s",
        "2",
        "--model",
        str(model_dir),
    ]
    procs: list[ServiceProcess] = []
    try:
        called: dict[str, ServiceProcess] = {}
        others: list[ServiceProcess] = []
        for role, count in TOPOLOGIES[topology]:
            for i in range(1, count + 1):
                name = f"{role}-{i}"
                proc = _spawn(
                    name,
                    f"services.{role}",
                    [
                        *common,
                        "--instance-id",
                        name,
                        "--threads",
                        "1",
                        "--num-pages",
                        "2048",
                        "--load-report-interval-s",
                        "0.05",
                    ],
                    tmp,
                )
                procs.append(proc)
                if role == "prefill":
                    others.append(proc)
                else:
                    called[name] = proc
        gateway = _spawn(
            "gateway-1",
            "services.gateway",
            [*common, "--instance-id", "gateway-1", "--port", "0", "--request-retries", "2"],
            tmp,
        )
        procs.append(gateway)
        wait_all_ready(procs, READY_TIMEOUT_S)
        yield Cluster(topology, model_dir, etcd, nats, called, others, gateway)
    finally:
        stop_all(procs, 5.0)
        etcd.stop()
        nats.stop()


@pytest.fixture(scope="module")
def reference(cluster: Cluster):  # -> Callable[[list[int], int], list[int]]
    """Greedy token ids of the engine run in this process on the same model (the ground truth)."""
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.modelspec.sampling import SamplingParams

    cfg = resolve(
        "worker",
        ["--model", str(cluster.model_dir), "--num-pages", "1024", "--threads", "1", "--dtype", "float32"],
        env={},
    )
    engine = Engine.from_config(cfg)

    def run(prompt: list[int], max_tokens: int) -> list[int]:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return list(engine.generate([prompt], sp)[0].token_ids)

    return run


@pytest.fixture(scope="module")
def tokenizer(cluster: Cluster):  # -> GatewayTokenizer
    from services.gateway.text.tokenizer import GatewayTokenizer

    return GatewayTokenizer.from_dir(cluster.model_dir)


@dataclass
class BusWatch:
    bus: Bus
    loads: LoadTable
    cancels: list[Cancel]
    stored_by: dict[str, int]  # instance id -> pages its KV events reported stored


async def _watch_bus(cluster: Cluster) -> BusWatch:
    bus = await Bus(cluster.nats.url, name="test").connect()
    w = BusWatch(bus, await LoadTable().subscribe(bus, CLUSTER), [], {})

    def on_cancel(msg: Cancel, meta: Meta) -> None:
        w.cancels.append(msg)

    def on_kv(ev: KVEventBatch, meta: Meta) -> None:
        n = sum(len(op.block_hashes) for op in ev.ops if op.kind == KVOpKind.STORED)
        w.stored_by[ev.instance_id] = w.stored_by.get(ev.instance_id, 0) + n

    await subscribe_cancel(bus, CLUSTER, on_cancel)
    await subscribe_kv_events(bus, CLUSTER, on_kv)
    return w


async def _wait(predicate, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


def _running(loads: LoadTable, cluster: Cluster) -> dict[str, int]:
    """Running requests of the instances the gateway calls (workers or decodes), from their load reports."""
    return {iid: r.load.running for iid, r in loads.fresh(0.5).items() if iid in cluster.workers}


def _sse_events(lines: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


# ---------------------------------------------------------------- tests


async def test_chat_matches_the_engine_streaming_and_not(cluster: Cluster, reference, tokenizer) -> None:
    prompt = tokenizer.encode_chat(MESSAGES)
    want_ids = reference(prompt, 24)
    want = tokenizer.decode(want_ids)
    body = {"messages": MESSAGES, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    watch = await _watch_bus(cluster)
    async with httpx.AsyncClient(base_url=cluster.http, timeout=30) as c:
        assert (await c.get("/ready")).status_code == 200, cluster.logs()
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["choices"][0]["message"]["content"] == want
        assert data["usage"]["prompt_tokens"] == len(prompt) and data["usage"]["completion_tokens"] == 24
        async with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            assert s.status_code == 200
            events = _sse_events([line async for line in s.aiter_lines()])
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        assert text == want
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    try:
        if cluster.topology == "disaggregated":
            # The prompt (two full pages) was computed by the prefill instance, which cached it.
            await _wait(lambda: watch.stored_by.get("prefill-1", 0) >= len(prompt) // 16, 5, "prefill KV events")
    finally:
        await watch.bus.close()


async def test_repeated_prompt_goes_to_the_worker_holding_its_prefix(cluster: Cluster, tokenizer) -> None:
    long_text = " ".join(f"item {i} of a long shared document;" for i in range(60))
    messages = [{"role": "system", "content": long_text}, {"role": "user", "content": "Summarize."}]
    assert len(tokenizer.encode_chat(messages)) > 200
    watch = await _watch_bus(cluster)
    try:
        async with httpx.AsyncClient(base_url=cluster.http, timeout=30) as c:
            cached = []
            for _ in range(4):
                r = await c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})
                assert r.status_code == 200, r.text
                cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
                await asyncio.sleep(0.3)  # KV events and load reports reach the gateway
        assert cached[0] == 0
        # Every repeat lands where the prefix is (round robin would alternate and miss every other time).
        assert all(c >= 192 for c in cached[1:]), f"cached tokens per request: {cached}"
    finally:
        await watch.bus.close()


async def test_grpc_api_generate_tokenize_models_health(cluster: Cluster, reference, tokenizer) -> None:
    assert cluster.gateway.ready is not None
    async with grpc.aio.insecure_channel(cluster.gateway.ready.grpc) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        health = await stub.Health(gateway_pb2.HealthRequest())
        assert health.serving and not health.discovery_stale
        want_roles = {(role, n) for role, n in TOPOLOGIES[cluster.topology]}
        assert {(r.role, r.ready) for r in health.roles} >= want_roles
        models = await stub.ListModels(gateway_pb2.ListModelsRequest())
        assert [m.id for m in models.models] == [cluster.model_dir.name]
        tok = await stub.Tokenize(gateway_pb2.TokenizeRequest(text="hello world"))
        assert list(tok.token_ids) == tokenizer.encode_text("hello world") and tok.max_model_len == CONTEXT
        req = gateway_pb2.GenerateRequest(
            chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(**m) for m in MESSAGES]),
            sampling=common_pb2.SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, skip_special_tokens=True),
            return_token_ids=True,
        )
        msgs = [m async for m in stub.Generate(req)]
        ids = [t for m in msgs for t in m.token_ids]
        assert ids == reference(tokenizer.encode_chat(MESSAGES), 24)
        # (the detokenizer drops a character cut in half by max_tokens; these 24 tokens end on a whole one)
        assert "".join(m.text for m in msgs) == tokenizer.decode(ids)
        assert msgs[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH and msgs[-1].usage.completion_tokens == 24
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in stub.Generate(gateway_pb2.GenerateRequest(model="no-such-model", text="hi")):
                pass
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_unknown_model_is_404(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.http, timeout=30) as c:
        r = await c.post("/v1/chat/completions", json={"model": "no-such-model", "messages": MESSAGES})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_client_disconnect_aborts_on_the_worker(cluster: Cluster, tokenizer) -> None:
    watch = await _watch_bus(cluster)
    loads, cancels = watch.loads, watch.cancels
    try:
        await _wait(
            lambda: len(_running(loads, cluster)) == 2 and not any(_running(loads, cluster).values()),
            10,
            "both workers idle",
        )
        body = {"prompt": "count", "max_tokens": CONTEXT - 100, "temperature": 0, "ignore_eos": True, "stream": True}
        async with httpx.AsyncClient(base_url=cluster.http, timeout=30) as c:
            async with c.stream("POST", "/v1/completions", json=body) as s:
                lines = s.aiter_lines()
                first = None
                while first is None:
                    line = await anext(lines)
                    if line.startswith("data: {"):
                        first = json.loads(line[6:])
                await _wait(lambda: sum(_running(loads, cluster).values()) == 1, 5, "the request running on a worker")
            # leaving the block closed the connection mid-stream (thousands of tokens were still to come)
        took = await _wait(lambda: not any(_running(loads, cluster).values()), 5, "the worker aborted the request")
        await _wait(lambda: any(c.request_id == first["id"] for c in cancels), 5, "a NATS cancel")
        assert took < 5
    finally:
        await watch.bus.close()


async def test_worker_killed_mid_stream_is_replayed(cluster: Cluster, reference, tokenizer) -> None:
    prompt_text = "The paged KV cache"
    prompt = tokenizer.encode_text(prompt_text)
    n = 1500
    want = tokenizer.decode(reference(prompt, n))
    watch = await _watch_bus(cluster)
    loads = watch.loads
    try:
        await _wait(
            lambda: len(_running(loads, cluster)) == 2 and not any(_running(loads, cluster).values()),
            10,
            "both workers idle",
        )
        body = {"prompt": prompt_text, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
        victim = ""
        async with httpx.AsyncClient(base_url=cluster.http, timeout=60) as c:
            async with c.stream("POST", "/v1/completions", json=body) as s:
                assert s.status_code == 200
                events: list[dict] = []
                async for line in s.aiter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))
                    if len(events) == 5:
                        await _wait(lambda: sum(_running(loads, cluster).values()) == 1, 5, "the request on a worker")
                        victim = next(iid for iid, n_run in _running(loads, cluster).items() if n_run)
                        os.kill(cluster.workers[victim].proc.pid, signal.SIGKILL)
        assert victim, "the stream ended before the kill"
        assert cluster.workers[victim].proc.wait(5) == -signal.SIGKILL
        errors = [e["error"] for e in events if "error" in e]
        assert not errors, f"the stream ended with {errors}\n{cluster.logs()}"
        text = "".join(e["choices"][0]["text"] for e in events)
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert text == want, f"replayed stream differs from the engine's greedy output\n{cluster.logs()}"
        rid = events[0]["id"]
        gateway_log = cluster.gateway.log()
        cut = [line for line in gateway_log.splitlines() if f"request {rid} attempt 0 on " in line]
        assert cut and victim in cut[0] and "failed" in cut[0], (
            f"the stream must have been cut and replayed, not finished before the kill\n{gateway_log[-3000:]}"
        )
    finally:
        await watch.bus.close()
