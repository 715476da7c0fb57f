"""Control-plane benchmark: pdrelay's discovery, bus and gRPC paths next to the raw etcd / NATS / gRPC they wrap.

    python -m bench.control_plane [--n 200] [--json]

Every figure is measured in this run, on this machine, against servers this run starts (etcd and nats-server
on free loopback ports; the echo service and a bare gRPC server as child processes), and printed with the ratio
ours / raw, so the overhead of each layer reads directly:

    discovery propagation   Registrar.update -> Membership event   vs  kv.put -> raw watch event   (latency)
    bus fan-out             Bus.publish(KVEventBatch) -> 4 typed subs   vs  nc.publish(bytes) -> 4 subs (msgs/s)
    bus request/reply       Bus.request/serve (typed), serial      vs  nc.request/respond           (req/s)
    gRPC unary              echo service Tokenize (drain gate,...) vs  bare grpc.aio server          (req/s)
    gRPC stream             echo service Decode.Generate           vs  bare server-streaming method  (msgs/s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import msgspec
import nats

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc
from shared.cluster.bus.client import Bus
from shared.cluster.bus.kv_events import KVEventBatch, KVOp, KVOpKind
from shared.cluster.bus.scale import ScaleReply, ScaleRequest
from shared.cluster.etcd import connect_etcd
from shared.cluster.handshake import parse_ready_line
from shared.cluster.instance import InstanceInfo, InstanceState
from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port, stop_process
from shared.cluster.membership import Membership
from shared.cluster.registration import Registrar

FANOUT_SUBSCRIBERS = 4


@dataclass(frozen=True)
class Row:
    metric: str
    unit: str
    ours: float
    raw: float
    better: str  # "lower" or "higher"

    @property
    def ratio(self) -> float:
        return self.ours / self.raw if self.raw else float("nan")


# ---------------------------------------------------------------- discovery


async def discovery_latency(etcd_url: str, n: int) -> tuple[float, float]:
    """Median ms from a registration update to the watcher's event: ours vs raw put -> watch."""
    from etcd3aio import prefix_range_end

    writer, reader = await connect_etcd([etcd_url]), await connect_etcd([etcd_url])
    info = InstanceInfo(cluster="bench", role="decode", instance_id="d-1", grpc_address="127.0.0.1:1")
    reg = Registrar(writer, info, ttl_s=10)
    await reg.register()
    ours: list[float] = []
    async with Membership(reader, "bench") as m:
        got = asyncio.Event()
        m.on_event(lambda ev: got.set())
        for i in range(n):
            got.clear()
            t0 = time.perf_counter()
            await reg.update(state=InstanceState.READY if i % 2 else InstanceState.DRAINING, labels={"i": str(i)})
            await got.wait()
            ours.append((time.perf_counter() - t0) * 1e3)
    await reg.deregister()

    prefix = "/bench-raw/"
    raw: list[float] = []
    assert reader.watch is not None and writer.kv is not None
    stream = reader.watch.watch(prefix, range_end=prefix_range_end(prefix))
    assert isinstance(stream, AsyncGenerator)  # declared an AsyncIterator; closed below before the clients
    first = await stream.__anext__()  # the "created" answer
    assert first.created
    for i in range(n):
        t0 = time.perf_counter()
        await writer.kv.put(f"{prefix}k", f"v{i}")
        while True:
            resp = await stream.__anext__()
            if resp.events:
                break
        raw.append((time.perf_counter() - t0) * 1e3)
    await stream.aclose()
    await writer.close()
    await reader.close()
    return statistics.median(ours), statistics.median(raw)


# ---------------------------------------------------------------- bus


async def _fanout_ours(nats_url: str, n: int) -> float:
    pub = await Bus(nats_url, name="bench-pub", pending_bytes=64 << 20).connect()
    subs = [await Bus(nats_url, name=f"bench-sub-{i}").connect() for i in range(FANOUT_SUBSCRIBERS)]
    subject, total, count, done = "pdrelay.bench.kv.p-1", n * FANOUT_SUBSCRIBERS, [0], asyncio.Event()

    def on_msg(event: KVEventBatch, meta: object) -> None:
        count[0] += 1
        if count[0] == total:
            done.set()

    for s in subs:
        await s.subscribe(subject, KVEventBatch, on_msg)
    await asyncio.sleep(0.1)  # the SUBs reach the server before the first publish
    t0 = time.perf_counter()
    for _ in range(n):
        await pub.publish(subject, _EVENT)
    await asyncio.wait_for(done.wait(), 60)
    rate = total / (time.perf_counter() - t0)
    for b in (pub, *subs):
        await b.close()
    return rate


async def _fanout_raw(nats_url: str, n: int) -> float:
    pub = await nats.connect(nats_url, pending_size=64 << 20)
    subs = [await nats.connect(nats_url) for _ in range(FANOUT_SUBSCRIBERS)]
    subject, total, count, done = "bench.raw.kv", n * FANOUT_SUBSCRIBERS, [0], asyncio.Event()
    payload = msgspec.msgpack.encode(_EVENT)  # same bytes on the wire as ours

    async def on_msg(msg: object) -> None:
        count[0] += 1
        if count[0] == total:
            done.set()

    for s in subs:
        await s.subscribe(subject, cb=on_msg)
        await s.flush()
    t0 = time.perf_counter()
    for _ in range(n):
        await pub.publish(subject, payload)
    await pub.flush()  # everything is on the wire before we wait for it (as Bus.publish's buffer is)
    await asyncio.wait_for(done.wait(), 60)
    rate = total / (time.perf_counter() - t0)
    for c in (pub, *subs):
        await c.close()
    return rate


async def _request_reply_ours(nats_url: str, n: int) -> float:
    server, client = await Bus(nats_url, name="bench-srv").connect(), await Bus(nats_url, name="bench-cli").connect()
    await server.serve("bench.typed.rr", ScaleRequest, lambda req, meta: ScaleReply(ok=True, counts=req.targets))
    await asyncio.sleep(0.1)
    req = ScaleRequest(targets={"prefill": 2, "decode": 3})
    t0 = time.perf_counter()
    for _ in range(n):
        await client.request("bench.typed.rr", req, ScaleReply)
    rate = n / (time.perf_counter() - t0)
    await server.close()
    await client.close()
    return rate


async def _request_reply_raw(nats_url: str, n: int) -> float:
    server, client = await nats.connect(nats_url), await nats.connect(nats_url)

    async def respond(msg) -> None:
        await msg.respond(msg.data)

    await server.subscribe("bench.raw.rr", cb=respond)
    await server.flush()
    await asyncio.sleep(0.1)  # as for ours: the interest has spread before the first request
    payload = msgspec.msgpack.encode(ScaleRequest(targets={"prefill": 2, "decode": 3}))
    t0 = time.perf_counter()
    for _ in range(n):
        await client.request("bench.raw.rr", payload, timeout=2)
    rate = n / (time.perf_counter() - t0)
    await server.close()
    await client.close()
    return rate


_EVENT = KVEventBatch(
    instance_id="p-1", epoch=1, seq=1, page_size=16, ops=(KVOp(KVOpKind.STORED, tuple(range(2**40, 2**40 + 8))),)
)


# ---------------------------------------------------------------- gRPC


def _spawn(argv: list[str]) -> tuple[subprocess.Popen, str]:
    """Start a child that prints a ready line with its gRPC address; return (process, address)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        info = parse_ready_line(line)
        if info is not None:
            return proc, info.grpc
    stop_process(proc)
    raise RuntimeError(f"{argv[:4]} did not become ready")


async def _grpc_rates(address: str, n: int, stream_len: int, raw: bool) -> tuple[float, float]:
    async with grpc.aio.insecure_channel(address) as ch:
        if raw:
            unary = ch.unary_unary("/bench.Raw/Echo")
            stream = ch.unary_stream("/bench.Raw/Stream")
            unary_call: Callable[[], Awaitable[object]] = lambda: unary(b"hello")
            stream_req = stream_len.to_bytes(4, "little")
            stream_call = lambda: stream(stream_req)
        else:
            gw, dec = gateway_pb2_grpc.GatewayStub(ch), worker_pb2_grpc.DecodeStub(ch)
            tok_req = gateway_pb2.TokenizeRequest(text="hello")
            unary_call = lambda: gw.Tokenize(tok_req)
            gen_req = worker_pb2.DecodeRequest(
                request_id="b",
                prompt_token_ids=list(range(stream_len)),
                sampling=common_pb2.SamplingParams(max_tokens=stream_len),
            )
            stream_call = lambda: dec.Generate(gen_req)
        for _ in range(20):  # warm the connection
            await unary_call()
        t0 = time.perf_counter()
        for _ in range(n):
            await unary_call()
        unary_rate = n / (time.perf_counter() - t0)
        msgs = 0
        t0 = time.perf_counter()
        for _ in range(max(1, n // 20)):
            async for _msg in stream_call():
                msgs += 1
        stream_rate = msgs / (time.perf_counter() - t0)
    return unary_rate, stream_rate


def serve_raw_grpc() -> int:
    """Hidden mode: a bare grpc.aio server (generic handlers, no interceptors, no health) for the baseline."""

    async def echo(req: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
        return req

    async def stream(req: bytes, ctx: grpc.aio.ServicerContext):
        for i in range(int.from_bytes(req, "little")):
            yield i.to_bytes(4, "little")

    async def main() -> None:
        server = grpc.aio.server()
        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Raw", handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(
            json.dumps(
                {
                    "event": "ready",
                    "role": "raw",
                    "instance_id": "raw",
                    "cluster": "",
                    "grpc": f"127.0.0.1:{port}",
                    "epoch": 0,
                    "pid": 0,
                }
            ),
            flush=True,
        )
        await server.wait_for_termination()

    asyncio.run(main())
    return 0


# ---------------------------------------------------------------- main


async def _best_of(
    rounds: int, ours: Callable[[], Awaitable[float]], raw: Callable[[], Awaitable[float]]
) -> tuple[float, float]:
    """Interleave ours and raw `rounds` times and keep each one's best rate: other load on a shared box
    then hurts both sides alike instead of whichever happened to run during it."""
    best_ours = best_raw = 0.0
    for _ in range(rounds):
        best_ours = max(best_ours, await ours())
        best_raw = max(best_raw, await raw())
    return best_ours, best_raw


async def run_all(n: int, etcd_url: str, nats_url: str, rounds: int = 2) -> list[Row]:
    rows: list[Row] = []
    ours, raw = await discovery_latency(etcd_url, n)
    rows.append(Row("discovery propagation (median)", "ms", ours, raw, "lower"))
    ours, raw = await _best_of(rounds, lambda: _fanout_ours(nats_url, n * 25), lambda: _fanout_raw(nats_url, n * 25))
    rows.append(Row(f"bus fan-out to {FANOUT_SUBSCRIBERS} subscribers", "msgs/s", ours, raw, "higher"))
    ours, raw = await _best_of(
        rounds, lambda: _request_reply_ours(nats_url, n * 5), lambda: _request_reply_raw(nats_url, n * 5)
    )
    rows.append(Row("bus request/reply, serial", "req/s", ours, raw, "higher"))
    echo, echo_addr = await asyncio.to_thread(
        _spawn,
        [
            sys.executable,
            "-m",
            "services.echo",
            "--etcd-endpoints",
            etcd_url,
            "--nats-url",
            nats_url,
            "--cluster",
            "bench",
            "--instance-id",
            "echo-bench",
            "--log-level",
            "warning",
        ],
    )
    rawp, raw_addr = await asyncio.to_thread(_spawn, [sys.executable, "-m", "bench.control_plane", "--serve-raw-grpc"])
    try:
        best = {"ou": 0.0, "os": 0.0, "ru": 0.0, "rs": 0.0}
        for _ in range(rounds):
            ou, os_ = await _grpc_rates(echo_addr, n * 5, 100, raw=False)
            ru, rs = await _grpc_rates(raw_addr, n * 5, 100, raw=True)
            for k, v in (("ou", ou), ("os", os_), ("ru", ru), ("rs", rs)):
                best[k] = max(best[k], v)
    finally:
        stop_process(echo)
        stop_process(rawp)
    rows.append(Row("gRPC unary round trip, serial", "req/s", best["ou"], best["ru"], "higher"))
    rows.append(Row("gRPC server stream (100 msgs/call)", "msgs/s", best["os"], best["rs"], "higher"))
    return rows


def format_rows(rows: list[Row]) -> str:
    out = [f"{'metric':<38} {'unit':<7} {'pdrelay':>10} {'raw':>10} {'ours/raw':>9}"]
    for r in rows:
        out.append(f"{r.metric:<38} {r.unit:<7} {r.ours:>10.2f} {r.raw:>10.2f} {r.ratio:>9.2f}  ({r.better} is better)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.control_plane", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200, help="base iteration count (fan-out sends 25x, RPCs 5x)")
    p.add_argument("--etcd", default=None, help="use this etcd instead of starting one")
    p.add_argument("--nats", default=None, help="use this NATS server instead of starting one")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per throughput pair (best kept)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--serve-raw-grpc", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.serve_raw_grpc:
        return serve_raw_grpc()
    if ns.n < 1:
        p.error(f"--n must be >= 1 (got {ns.n})")
    with tempfile.TemporaryDirectory(prefix="pdrelay-bench-") as tmp:
        etcd_url, nats_url = ns.etcd, ns.nats
        started: list[EtcdServer | NatsServer] = []
        if etcd_url is None:
            etcd = EtcdServer(data_dir=Path(tmp) / "etcd", port=free_port())
            etcd.start()
            started.append(etcd)
            etcd_url = etcd.url
        if nats_url is None:
            nats_server = NatsServer(data_dir=Path(tmp) / "nats", port=free_port())
            nats_server.start()
            started.append(nats_server)
            nats_url = nats_server.url
        try:
            rows = asyncio.run(run_all(ns.n, etcd_url, nats_url, max(1, ns.rounds)))
        finally:
            for server in reversed(started):
                server.stop()
    if ns.json:
        print(json.dumps([{**asdict(r), "ratio": r.ratio} for r in rows], indent=2))
    else:
        print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
