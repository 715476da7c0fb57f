"""Fixtures that run a real etcd and nats-server on free ports in tmp dirs, stopped by PID at teardown.

Use them from a conftest.py: `from tests.helpers.servers import etcd_server, nats_server  # noqa: F401`.
The returned objects can `kill()` (SIGKILL, like a crash), `restart()` (same port and data dir) and `stop()`.
`TcpProxy` puts a cuttable link between a client and a server (a partition with both ends alive).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port


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
