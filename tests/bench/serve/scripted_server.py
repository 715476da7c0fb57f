"""A scripted HTTP/1.1 server on a free loopback port for the benchmark client's tests.

Each path is a scenario (see `ScriptedServer._respond`): SSE events written with chosen delays, chunked or
sized or close-delimited framing, error statuses, and a server that drops idle keep-alive connections. It
counts connections and records request bodies, so tests can see pooling and what was sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

# An event is (delay before it in seconds, payload dict or the string "[DONE]").
Script = list[tuple[float, Any]]


def completion_chunk(text: str) -> dict[str, Any]:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def chat_chunk(content: str | None, role: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def sse_bytes(payload: Any) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


class ScriptedServer:
    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.connections = 0
        self.bodies: list[bytes] = []
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                self.bodies.append(await reader.readexactly(length) if length else b"")
                if not await self._respond(path, writer):
                    return
        finally:
            writer.close()

    async def _respond(self, path: str, w: asyncio.StreamWriter) -> bool:
        """Answer one request; False closes the connection afterwards."""
        if path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "scripted"}]}).encode()
            w.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await w.drain()
            return True
        if path.startswith("/error"):
            body = b'{"error": {"message": "bad request: max_tokens too large"}}'
            w.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await w.drain()
            return True
        script = self.scripts.get(path, [])
        if path.startswith("/sized"):  # whole body with Content-Length, written in one go after the delays
            for delay, _ in script:
                await asyncio.sleep(delay)
            body = b"".join(sse_bytes(p) for _, p in script)
            w.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            await w.drain()
            return True
        close = path.startswith("/close")
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + (b"connection: close\r\n\r\n" if close else b"transfer-encoding: chunked\r\n\r\n")
        )
        for delay, payload in script:
            if delay:
                await asyncio.sleep(delay)
            data = sse_bytes(payload)
            w.write(data if close else b"%x\r\n%s\r\n" % (len(data), data))
            await w.drain()
        if not close:
            w.write(b"0\r\n\r\n")
            await w.drain()
        # "/drop...": answered properly, then the idle keep-alive connection is closed by the server
        return not close and not path.startswith("/drop")
