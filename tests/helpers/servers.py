"""Fixtures that run a real etcd and nats-server on free ports in tmp dirs, stopped by PID at teardown.

Use them from a conftest.py: `from tests.helpers.servers import etcd_server, nats_server  # noqa: F401`.
The returned objects can `kill()` (SIGKILL, like a crash), `restart()` (same port and data dir) and `stop()`.
`TcpProxy` puts a cuttable link between a client and a server (a partition with both ends alive).
`EchoProcess` runs the echo test service (the real lifecycle) as a child process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.cluster.handshake import ReadyInfo, parse_ready_line, read_ready_file
from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port, stop_process


def start_etcd(tmp: Path) -> EtcdServer:
    server = EtcdServer(data_dir=tmp / "etcd", port=free_port())
    server.start()
    return server


def start_nats(tmp: Path) -> NatsServer:
    server = NatsServer(data_dir=tmp / "nats", port=free_port())
    server.start()
    return server


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = start_nats(tmp_path)
    try:
        yield server
    finally:
        server.stop()


class TcpProxy:
    """A loopback TCP proxy whose link can be cut and healed: a network partition between a client and a server.

    `cut()` closes every open connection and stops listening (new connections are refused); `heal()` listens
    again on the same port. Runs in the test's event loop.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers.difference_update((writer, up_writer))

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def heal(self) -> None:
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()


class EchoProcess:
    """The `echo` test service (services.echo) as a real child process, started and waited for."""

    def __init__(
        self,
        etcd: EtcdServer,
        nats: NatsServer,
        tmp: Path,
        *args: str,
        instance_id: str = "echo-1",
        cluster: str = "t",
        lease_ttl_s: int = 2,
    ) -> None:
        self.instance_id = instance_id
        self.ready_file = tmp / f"{instance_id}.ready"
        self.log_path = tmp / f"{instance_id}.log"
        cmd = [
            sys.executable,
            "-m",
            "services.echo",
            "--etcd-endpoints",
            etcd.url,
            "--nats-url",
            nats.url,
            "--cluster",
            cluster,
            "--instance-id",
            instance_id,
            "--lease-ttl-s",
            str(lease_ttl_s),
            "--ready-file",
            str(self.ready_file),
            "--load-report-interval-s",
            "0.1",
            *args,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        self.ready: ReadyInfo | None = None

    def wait_ready(self, timeout: float = 20.0) -> ReadyInfo:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"echo exited with {self.proc.returncode}:\n{self.log()}")
            info = read_ready_file(self.ready_file)
            if info is not None:
                line = self.proc.stdout.readline()  # the same handshake also went to stdout
                assert parse_ready_line(line) == info, f"stdout ready line {line!r} differs from the ready file"
                self.ready = info
                return info
            time.sleep(0.05)
        raise TimeoutError(f"echo not ready within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        return stop_process(self.proc)
