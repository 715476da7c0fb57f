"""The benchmark's HTTP clients against a scripted server: framings, keep-alive, stale connections, errors, and
the lean client agreeing with httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.serve.http_client import HTTP_CLIENTS, HttpError, SseSplitter, StreamingHttp, make_http
from tests.bench.serve.scripted_server import ScriptedServer, completion_chunk, sse_bytes

EVENTS = [completion_chunk(f"tok{i}") for i in range(5)] + ["[DONE]"]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    s = await ScriptedServer().start()
    for path in ("/chunked", "/sized", "/close", "/drop"):
        s.scripts[path] = [(0.0, e) for e in EVENTS]
    try:
        yield s
    finally:
        await s.close()


async def _payloads(http: StreamingHttp, path: str) -> list[bytes]:
    out: list[bytes] = []
    async for _, events in http.stream(path, b'{"x": 1}'):
        out.extend(events)
    return out


def _expected() -> list[bytes]:
    return [sse_bytes(e)[len("data: ") : -2] for e in EVENTS]


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
@pytest.mark.parametrize("path", ["/chunked", "/sized", "/close"])
async def test_framings_deliver_every_event(server: ScriptedServer, kind: str, path: str) -> None:
    http = make_http(kind, server.url)
    try:
        assert await _payloads(http, path) == _expected()
        assert await _payloads(http, path) == _expected()
    finally:
        await http.aclose()
    assert server.bodies[-1] == b'{"x": 1}'


async def test_raw_client_keeps_connections_alive(server: ScriptedServer) -> None:
    http = make_http("raw", server.url)
    try:
        for _ in range(5):
            assert await _payloads(http, "/chunked") == _expected()
        assert (await http.get_json("/v1/models"))["data"][0]["id"] == "scripted"
    finally:
        await http.aclose()
    assert server.connections == 1


async def test_raw_client_closes_connection_after_close_delimited_body(server: ScriptedServer) -> None:
    http = make_http("raw", server.url)
    try:
        for _ in range(3):
            assert await _payloads(http, "/close") == _expected()
    finally:
        await http.aclose()
    assert server.connections == 3


async def test_raw_client_retries_once_when_the_server_dropped_an_idle_connection(server: ScriptedServer) -> None:
    http = make_http("raw", server.url)
    try:
        for _ in range(3):  # each answer is followed by the server closing the pooled connection
            assert await _payloads(http, "/drop") == _expected()
    finally:
        await http.aclose()
    assert server.connections == 3


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
async def test_error_status_raises_http_error_with_the_body(server: ScriptedServer, kind: str) -> None:
    http = make_http(kind, server.url)
    try:
        with pytest.raises(HttpError, match="HTTP 400: .*max_tokens too large") as info:
            await _payloads(http, "/error")
        assert info.value.status == 400
        # the connection is still usable afterwards
        assert await _payloads(http, "/chunked") == _expected()
    finally:
        await http.aclose()


async def test_abandoned_stream_does_not_poison_the_pool(server: ScriptedServer) -> None:
    server.scripts["/slow"] = [(0.0, EVENTS[0]), (0.2, EVENTS[1]), (0.0, "[DONE]")]
    http = make_http("raw", server.url)
    try:
        stream = http.stream("/slow", b"{}")
        _, first = await stream.__anext__()
        assert first == [_expected()[0]]
        await stream.aclose()  # unread bytes remain on that connection: it must not be reused
        assert await _payloads(http, "/chunked") == _expected()
    finally:
        await http.aclose()
    assert server.connections == 2


def test_bad_base_url_is_named() -> None:
    with pytest.raises(ValueError, match="ftp://x"):
        make_http("raw", "ftp://x")
    with pytest.raises(ValueError, match="--http-client 'curl'"):
        make_http("curl", "http://127.0.0.1:1")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.booleans())
def test_sse_splitter_is_independent_of_read_boundaries(cuts: list[int], crlf: bool) -> None:
    stream = b": keep-alive comment\n\n" + b"".join(sse_bytes(e) for e in EVENTS)
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)])]
    sse = SseSplitter()
    got = [p for piece in pieces for p in sse.feed(piece)]
    assert got == _expected()


@pytest.mark.parametrize("path", ["/chunked", "/sized", "/close"])
async def test_raw_client_with_quickack_delivers_every_event(server: ScriptedServer, path: str) -> None:
    http = make_http("raw", server.url, quickack=True)
    try:
        for _ in range(3):
            assert await _payloads(http, path) == _expected()
    finally:
        await http.aclose()


def test_quickack_needs_the_raw_client() -> None:
    with pytest.raises(ValueError, match="--tcp-quickack needs --http-client raw"):
        make_http("httpx", "http://127.0.0.1:1", quickack=True)
