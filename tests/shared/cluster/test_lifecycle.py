"""The service lifecycle, run for real: the echo service as a child process against real etcd and NATS."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc
from shared.cluster.bus.client import Bus
from shared.cluster.bus.drain import send_drain
from shared.cluster.bus.load import LoadTable
from shared.cluster.etcd import connect_etcd
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.instance import InstanceState
from shared.cluster.localcluster.servers import free_port
from shared.cluster.membership import Membership
from shared.service import service_args, split_lifecycle_args
from tests.helpers.servers import EchoProcess

pytestmark = [pytest.mark.timeout(90), pytest.mark.e2e]


async def _membership(etcd_server) -> Membership:
    client = await connect_etcd([etcd_server.url])
    m = Membership(client, "t")
    await m.start()
    return m


async def _close(m: Membership) -> None:
    await m.close()
    await m._client.close()


def test_lifecycle_flags_are_split_from_role_flags() -> None:
    opts, rest = split_lifecycle_args(["--page-size", "16", "--ready-file", "r.json", "--drain-timeout-s", "3"])
    assert rest == ["--page-size", "16"]
    assert opts.ready_file == "r.json" and opts.drain_timeout_s == 3
    with pytest.raises(ValueError, match="--drain-timeout-s"):
        split_lifecycle_args(["--drain-timeout-s", "-1"])


def test_service_args_take_a_resolved_config_or_raw_flags(tmp_path, capsys) -> None:
    from shared.config import resolve

    cfg = resolve("decode", ["--page-size", "32", "--instance-id", "d-7"], {})
    path = tmp_path / "decode.json"
    path.write_text(cfg.to_json())
    got, opts = service_args("decode", ["--resolved-config", str(path), "--ready-file", "r.json"])
    assert got == cfg and opts.ready_file == "r.json"
    raw, _ = service_args("decode", ["--page-size", "64"])
    assert raw.cache.page_size == 64
    for argv, role, words in (
        (["--resolved-config", str(path), "--page-size", "8"], "decode", "replaces"),
        (["--resolved-config", str(tmp_path / "none.json")], "decode", "cannot read"),
        (["--resolved-config", str(path)], "prefill", "not 'prefill'"),
    ):
        with pytest.raises(SystemExit) as e:
            service_args(role, argv)
        assert e.value.code == 2 and words in capsys.readouterr().err


async def test_ready_registration_health_and_rpcs(etcd_server, nats_server, tmp_path) -> None:
    echo = EchoProcess(etcd_server, nats_server, tmp_path)
    try:
        ready = await asyncio.to_thread(echo.wait_ready)
        assert ready.role == "echo" and ready.instance_id == "echo-1" and ready.pid == echo.proc.pid
        assert ready.epoch >= 1 and ready.grpc.startswith("127.0.0.1:")
        m = await _membership(etcd_server)
        info = m.get("echo-1")
        assert info is not None and info.state == InstanceState.READY and info.grpc_address == ready.grpc
        assert info.epoch == ready.epoch and info.pid == echo.proc.pid and info.model == "echo"

        async with grpc.aio.insecure_channel(ready.grpc) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for svc in ("", "pdrelay.v1.Decode"):
                r = await health.Check(health_pb2.HealthCheckRequest(service=svc))
                assert r.status == health_pb2.HealthCheckResponse.SERVING
            toks = await gateway_pb2_grpc.GatewayStub(ch).Tokenize(gateway_pb2.TokenizeRequest(text="héllo"))
            assert bytes(toks.token_ids) == "héllo".encode()
            req = worker_pb2.DecodeRequest(
                request_id="r1", prompt_token_ids=[5, 6, 7, 8], sampling=common_pb2.SamplingParams(max_tokens=3)
            )
            out = [r async for r in worker_pb2_grpc.DecodeStub(ch).Generate(req)]
            assert [list(r.token_ids) for r in out[:-1]] == [[5], [6], [7]]
            assert out[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH and out[-1].usage.completion_tokens == 3

        # load reports flow on the bus while the service is up
        async with Bus(nats_server.url) as bus:
            table = await LoadTable().subscribe(bus, "t")
            for _ in range(50):
                if "echo-1" in table.latest:
                    break
                await asyncio.sleep(0.05)
            assert table.latest["echo-1"].epoch == ready.epoch
        await _close(m)
    finally:
        echo.stop()


async def test_kill_9_key_gone_within_ttl(etcd_server, nats_server, tmp_path) -> None:
    echo = EchoProcess(etcd_server, nats_server, tmp_path, lease_ttl_s=2)
    try:
        await asyncio.to_thread(echo.wait_ready)
        m = await _membership(etcd_server)
        assert m.get("echo-1") is not None
        echo.proc.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        await m.wait_for(lambda m: m.get("echo-1") is None, 6)
        gone_after = time.monotonic() - t0
        assert gone_after <= 2 + 2.5, f"key outlived its 2 s lease by too much ({gone_after:.1f} s)"
        await _close(m)
    finally:
        echo.stop()


async def test_sigterm_drains_in_flight_work_before_deregistering(etcd_server, nats_server, tmp_path) -> None:
    echo = EchoProcess(etcd_server, nats_server, tmp_path, "--token-delay-s", "0.15")
    try:
        ready = await asyncio.to_thread(echo.wait_ready)
        m = await _membership(etcd_server)
        states: list[tuple[str, float]] = []
        m.on_event(lambda ev: states.append((ev.kind if ev.kind == "leave" else ev.instance.state, time.monotonic())))
        async with grpc.aio.insecure_channel(ready.grpc) as ch:
            decode = worker_pb2_grpc.DecodeStub(ch)
            n = 12  # 12 tokens x 0.15 s: still streaming well after the signal
            call = decode.Generate(worker_pb2.DecodeRequest(request_id="long", prompt_token_ids=list(range(n))))
            first = await call.read()
            assert list(first.token_ids) == [0]
            echo.proc.send_signal(signal.SIGTERM)
            await m.wait_for(lambda m: (i := m.get("echo-1")) is not None and i.state == InstanceState.DRAINING, 5)

            with pytest.raises(grpc.aio.AioRpcError) as refused:  # new work is refused, typed
                await decode.Generate(worker_pb2.DecodeRequest(request_id="new", prompt_token_ids=[1])).read()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            err = error_from_rpc(refused.value)
            assert err is not None and err.code == common_pb2.ERROR_CODE_DRAINING and err.retryable
            assert "draining" in refused.value.details() and err.instance_id == "echo-1"
            health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
            assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING

            rest = []  # the in-flight stream runs to its end
            while (r := await call.read()) is not grpc.aio.EOF:
                rest.append(r)
            stream_done = time.monotonic()
            assert [t for r in rest for t in r.token_ids] == list(range(1, n))
            assert rest[-1].finish_reason == common_pb2.FINISH_REASON_STOP
        rc = await asyncio.to_thread(echo.proc.wait, 10)
        assert rc == 0, echo.log()
        await m.wait_for(lambda m: m.get("echo-1") is None, 5)
        leave_at = [t for s, t in states if s == "leave"][0]
        assert leave_at >= stream_done - 0.05, "deregistered before the in-flight stream finished"
        assert [s for s, _ in states] == [InstanceState.DRAINING, "leave"]
        await _close(m)
    finally:
        echo.stop()


async def test_drain_command_on_the_bus_stops_the_instance(etcd_server, nats_server, tmp_path) -> None:
    echo = EchoProcess(etcd_server, nats_server, tmp_path)
    try:
        ready = await asyncio.to_thread(echo.wait_ready)
        async with Bus(nats_server.url) as bus:
            # a command for an older incarnation (epoch below the current one) is ignored
            await send_drain(bus, "t", "echo-1", reason="stale", epoch=ready.epoch - 1 if ready.epoch > 1 else -1)
            await asyncio.sleep(0.5)
            assert echo.proc.poll() is None
            await send_drain(bus, "t", "echo-1", reason="scale_down")
            rc = await asyncio.to_thread(echo.proc.wait, 10)
        assert rc == 0 and "scale_down" in echo.log()
    finally:
        echo.stop()


@pytest.mark.parametrize("which", ["etcd", "nats"])
def test_unreachable_control_plane_at_start_is_a_clear_error(etcd_server, nats_server, which) -> None:
    dead = f"http://127.0.0.1:{free_port()}" if which == "etcd" else f"nats://127.0.0.1:{free_port()}"
    etcd = dead if which == "etcd" else etcd_server.url
    nats = dead if which == "nats" else nats_server.url
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.echo",
            "--etcd-endpoints",
            etcd,
            "--nats-url",
            nats,
            "--connect-timeout-s",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert r.returncode == 2
    assert time.monotonic() - t0 < 15
    err = r.stderr
    assert dead in err and "pdrelay up" in err, err
    assert (
        ("--etcd-endpoints" in err and "etcd --data-dir" in err)
        if which == "etcd"
        else ("--nats-url" in err and "nats-server -a" in err)
    ), err
    assert "Traceback" not in err


def test_port_in_use_is_a_clear_error(etcd_server, nats_server) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.echo",
                "--etcd-endpoints",
                etcd_server.url,
                "--nats-url",
                nats_server.url,
                "--grpc-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert r.returncode == 2 and f"127.0.0.1:{port}" in r.stderr and "--grpc-port" in r.stderr, r.stderr


@pytest.mark.slow
async def test_service_reregisters_with_higher_epoch_after_etcd_is_replaced(etcd_server, nats_server, tmp_path) -> None:
    echo = EchoProcess(etcd_server, nats_server, tmp_path)
    try:
        ready = await asyncio.to_thread(echo.wait_ready)
        etcd_server.kill()
        etcd_server.wipe()
        await asyncio.to_thread(etcd_server.start)
        m = await _membership(etcd_server)
        await m.wait_for(lambda m: (i := m.get("echo-1")) is not None and i.epoch > ready.epoch, 15)
        info = m.get("echo-1")
        assert info.state == InstanceState.READY and info.grpc_address == ready.grpc
        await _close(m)
        echo.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(echo.proc.wait, 10) == 0
    finally:
        echo.stop()
