"""A minimal HTTP server for Prometheus on the service's own event loop: `GET /metrics` and nothing else.

No extra thread (prometheus_client's start_http_server runs one), so the collectors read engine and transfer
state from the loop that owns it. One request per connection (`Connection: close`), which is what Prometheus
scrapers and curl are happy with; a slow or silent client is dropped after a few seconds.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

_READ_TIMEOUT_S = 5.0
_MAX_HEAD = 16 * 1024


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        """Listen; returns the bound port. OSError (e.g. the port is taken) goes to the caller."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=_MAX_HEAD)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            method, _, rest = head.split(b"\r\n", 1)[0].partition(b" ")
            path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                await self._reply(writer, 405, b"text/plain", b"only GET /metrics\n", extra=b"Allow: GET\r\n")
            elif path != b"/metrics":
                await self._reply(writer, 404, b"text/plain", b"not found; try /metrics\n")
            else:
                body = generate_latest(self.registry)
                await self._reply(
                    writer, 200, CONTENT_TYPE_LATEST.encode(), b"" if method == b"HEAD" else body, length=len(body)
                )
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except Exception:  # a collector failing must not kill the server; say so once per scrape
            log.exception("serving /metrics failed")
            await self._reply(writer, 500, b"text/plain", b"collecting metrics failed; see the service log\n")
        finally:
            writer.close()

    @staticmethod
    async def _reply(
        writer: asyncio.StreamWriter,
        status: int,
        ctype: bytes,
        body: bytes,
        *,
        extra: bytes = b"",
        length: int | None = None,
    ) -> None:
        reason = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed", 500: b"Internal Server Error"}[status]
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n"
            % (status, reason, ctype, len(body) if length is None else length, extra)
            + body
        )
        try:
            await writer.drain()
        except ConnectionError:
            pass
