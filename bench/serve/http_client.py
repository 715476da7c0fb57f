"""HTTP/1.1 streaming for the serving benchmark: a lean keep-alive client on asyncio streams, and httpx.

The client shares the machine with the server it measures, so its CPU per request matters. `RawHttp` does
only what an SSE benchmark needs (POST with Content-Length; chunked, sized or close-delimited responses; a
keep-alive pool; TLS for https). Against the mock gateway with 8-token streams it used ~0.35-0.45 ms of client
CPU per request where httpx used ~2 ms (and httpx added several ms to TTFT); most of the raw client's cost is
the kernel's loopback send, which Linux charges to the sender. `HttpxHttp` is the reference implementation of
the same interface (and the way through proxies).
Both yield `(arrival_time, [sse data payloads])` per network read; the timestamp is taken when the bytes
arrive, before any parsing.

`quickack` (raw client, Linux): re-arm TCP_QUICKACK after every read. A server that leaves Nagle's algorithm on
(Dynamo's HTTP frontend does) holds a small chunk back until the previous one is ACKed, and the client's
delayed ACK waits up to 40 ms: streams then take ~44 ms whatever the server's own work. With quickack the
client ACKs at once and the benchmark measures the server's work, not the kernel's ACK timer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

HTTP_CLIENTS = ("raw", "httpx")


class HttpError(Exception):
    """The server answered with a non-2xx status."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace').strip()}")


class SseSplitter:
    """Bytes in, `data:` payloads out (events end with a blank line; CRLF tolerated; comments skipped)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            for line in buf[start:end].split(b"\n"):
                if line.startswith(b"data:"):
                    out.append(line[6:] if line[5:6] == b" " else line[5:])
            start = end + 2
        self._buf = buf[start:]
        return out


class StreamingHttp(Protocol):
    # an async generator (so `contextlib.aclosing` ends its request when the caller stops early)
    def stream(self, path: str, body: bytes) -> AsyncGenerator[tuple[float, list[bytes]], None]: ...

    async def get_json(self, path: str) -> Any: ...

    async def aclose(self) -> None: ...


def _split_base_url(base_url: str) -> tuple[str, str, int, str]:
    u = urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"--base-url {base_url!r} must look like http://HOST:PORT (or https://...)")
    port = u.port or (443 if u.scheme == "https" else 80)
    return u.scheme, u.hostname, port, u.path.rstrip("/")


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class _Conn:
    __slots__ = ("reader", "writer", "reused", "_sock")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, quickack: bool = False) -> None:
        self.reader, self.writer, self.reused = reader, writer, False
        self._sock = writer.get_extra_info("socket") if quickack and _QUICKACK is not None else None
        self.ack()

    def ack(self) -> None:
        """Quickack mode: ACK the next segments at once (the kernel leaves the mode by itself, so re-arm)."""
        if self._sock is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                self._sock = None

    def close(self) -> None:
        self.writer.close()


class RawHttp:
    """Minimal HTTP/1.1 client with a keep-alive pool (at most `max_connections` idle connections kept)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 256,
        quickack: bool = False,
    ) -> None:
        scheme, self.host, self.port, self.prefix = _split_base_url(base_url)
        self._quickack = quickack
        self._ssl = ssl.create_default_context() if scheme == "https" else None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        host_header = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        self._head = f"Host: {host_header}\r\nUser-Agent: pdrelay-bench\r\n{extra}"
        self._idle: list[_Conn] = []
        self._max_idle = max_connections

    async def _connect(self) -> _Conn:
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=1 << 20)
        return _Conn(reader, writer, self._quickack)

    async def _send(self, method: str, path: str, body: bytes) -> tuple[_Conn, int, dict[str, str]]:
        """Send on an idle connection (or a new one); retry once on a fresh one if the idle one was closed by
        the server before it answered a single byte (the usual keep-alive race)."""
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._head}"
            + (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if method == "POST" else "")
            + "\r\n"
        ).encode("latin-1")
        for attempt in (0, 1):
            conn = self._idle.pop() if self._idle and attempt == 0 else await self._connect()
            try:
                conn.ack()
                conn.writer.write(head + body)
                status_and_headers = await conn.reader.readuntil(b"\r\n\r\n")
                conn.ack()
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                conn.close()
                if conn.reused and attempt == 0 and not getattr(e, "partial", b""):
                    continue
                raise ConnectionError(f"{self.host}:{self.port} closed the connection: {e!r}") from None
            except BaseException:
                conn.close()
                raise
            lines = status_and_headers.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                k, sep, v = line.partition(":")
                if sep:
                    headers[k.strip().lower()] = v.strip()
            return conn, int(parts[1]), headers
        raise AssertionError("unreachable")

    async def _body(self, conn: _Conn, headers: dict[str, str]) -> AsyncIterator[bytes]:
        """Body pieces as they arrive; the caller owns `conn` and decides whether it can be reused."""
        reader = conn.reader
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readline()).split(b";", 1)[0], 16)
                conn.ack()
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b""):  # trailers
                        pass
                    return
                data = await reader.readexactly(size + 2)
                conn.ack()
                yield data[:-2]
        elif "content-length" in headers:
            remaining = int(headers["content-length"])
            while remaining > 0:
                data = await reader.read(min(remaining, 1 << 20))
                conn.ack()
                if not data:
                    raise ConnectionError("the response body ended before Content-Length")
                remaining -= len(data)
                yield data
        else:  # delimited by the server closing the connection
            while data := await reader.read(1 << 20):
                yield data

    def _release(self, conn: _Conn, headers: dict[str, str], complete: bool) -> None:
        framed = "chunked" in headers.get("transfer-encoding", "").lower() or "content-length" in headers
        if (
            complete
            and framed
            and headers.get("connection", "").lower() != "close"
            and len(self._idle) < self._max_idle
        ):
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.close()

    async def _read_all(self, conn: _Conn, headers: dict[str, str]) -> bytes:
        return b"".join([piece async for piece in self._body(conn, headers)])

    async def stream(self, path: str, body: bytes) -> AsyncGenerator[tuple[float, list[bytes]], None]:
        conn, status, headers = await self._send("POST", path, body)
        complete = False
        try:
            if status // 100 != 2:
                raise HttpError(status, await self._read_all(conn, headers))
            sse = SseSplitter()
            async for piece in self._body(conn, headers):
                now = time.perf_counter()
                events = sse.feed(piece)
                if events:
                    yield now, events
            complete = True
        finally:
            # Cancelled or abandoned mid-body: the connection holds unread bytes, so it is closed, not pooled.
            self._release(conn, headers, complete)

    async def get_json(self, path: str) -> Any:
        return json.loads(await self._whole("GET", path, b""))

    async def post_json(self, path: str, body: bytes) -> bytes:
        """POST a JSON body and return the whole response body (HttpError on a non-2xx status)."""
        return await self._whole("POST", path, body)

    async def _whole(self, method: str, path: str, body: bytes) -> bytes:
        conn, status, headers = await self._send(method, path, body)
        complete = False
        try:
            data = await self._read_all(conn, headers)
            complete = True
        finally:
            self._release(conn, headers, complete)
        if status // 100 != 2:
            raise HttpError(status, data)
        return data

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()


class HttpxHttp:
    """The same interface over httpx.AsyncClient (HTTP/1.1 keep-alive pool)."""

    def __init__(self, base_url: str, *, headers: Mapping[str, str] | None = None, max_connections: int = 256) -> None:
        import httpx

        _split_base_url(base_url)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=dict(headers or {}), limits=limits, timeout=None
        )

    async def stream(self, path: str, body: bytes) -> AsyncGenerator[tuple[float, list[bytes]], None]:
        async with self._client.stream(
            "POST", path, content=body, headers={"content-type": "application/json"}
        ) as resp:
            if resp.status_code // 100 != 2:
                raise HttpError(resp.status_code, await resp.aread())
            sse = SseSplitter()
            async for piece in resp.aiter_raw():
                now = time.perf_counter()
                events = sse.feed(piece)
                if events:
                    yield now, events

    async def get_json(self, path: str) -> Any:
        resp = await self._client.get(path)
        if resp.status_code // 100 != 2:
            raise HttpError(resp.status_code, resp.content)
        return resp.json()

    async def aclose(self) -> None:
        await self._client.aclose()


def make_http(
    kind: str, base_url: str, *, api_key: str | None = None, max_connections: int = 256, quickack: bool = False
) -> StreamingHttp:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if kind == "raw":
        return RawHttp(base_url, headers=headers, max_connections=max_connections, quickack=quickack)
    if quickack:
        raise ValueError("--tcp-quickack needs --http-client raw")
    if kind == "httpx":
        return HttpxHttp(base_url, headers=headers, max_connections=max_connections)
    raise ValueError(f"--http-client {kind!r} is not one of {', '.join(HTTP_CLIENTS)}")
