"""The gateway behind a real uvicorn on a free loopback port: SSE arrives incrementally, and a client that goes
away cancels the backend stream (streamed or not). Plus the mock_main entry point as a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from services.gateway.http.app import GatewayApp
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import GatewayTokenizer
from tests.services.gateway.conftest import MODEL, AppFactory
from tests.services.gateway.sse_client import parse_sse

MSG = [{"role": "user", "content": "count for me"}]


def free_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


@asynccontextmanager
async def running(app: GatewayApp) -> AsyncIterator[str]:
    """Serve `app` with uvicorn in this event loop; yields the base URL."""
    sock = free_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_sse_events_arrive_as_tokens_are_generated(make_app: AppFactory) -> None:
    backend = MockBackend([MODEL], token_delay_s=0.05)
    async with running(make_app(backend=backend)) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:
        arrivals: list[float] = []
        body = b""
        async with c.stream(
            "POST", "/v1/chat/completions", json={"messages": MSG, "max_tokens": 6, "stream": True}
        ) as r:
            assert r.status_code == 200
            async for piece in r.aiter_raw():
                arrivals.append(time.monotonic())
                body += piece
        events, done = parse_sse(body.decode())
        assert done and events[-1]["choices"][0]["finish_reason"] == "length"
        # Six tokens 50 ms apart: the first bytes come long before the last ones (not buffered to the end).
        assert arrivals[-1] - arrivals[0] >= 0.15
        assert backend.finished and not backend.cancelled


async def test_disconnect_mid_stream_cancels_the_backend(make_app: AppFactory) -> None:
    backend = MockBackend([MODEL], token_delay_s=0.02)
    app = make_app(backend=backend)
    async with running(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:
        async with c.stream(
            "POST", "/v1/chat/completions", json={"messages": MSG, "max_tokens": 400, "stream": True}
        ) as r:
            seen = b""
            async for piece in r.aiter_raw():
                seen += piece
                if seen.count(b"data: ") >= 3:
                    break  # leaving the block closes the connection mid-stream
        await asyncio.wait_for(backend.cancelled_event.wait(), 5)
        (req,) = backend.requests
        assert backend.cancelled == [req.request_id] and backend.finished == []
        await wait_for(lambda: app.metrics.in_flight._value.get() == 0)


async def test_disconnect_while_waiting_for_a_non_streamed_answer_cancels_the_backend(make_app: AppFactory) -> None:
    backend = MockBackend([MODEL], first_token_delay_s=30.0)  # a long prefill
    async with running(make_app(backend=backend)) as url, httpx.AsyncClient(base_url=url) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=0.3)
        await asyncio.wait_for(backend.cancelled_event.wait(), 5)
        assert len(backend.cancelled) == 1


async def test_concurrent_streams_are_independent(make_app: AppFactory, tiny_tokenizer: GatewayTokenizer) -> None:
    backend = MockBackend([MODEL], token_delay_s=0.005)
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(8)]  # the mock echoes them: every answer differs
    async with running(make_app(backend=backend)) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:

        async def one(prompt: list[int]) -> str:
            r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5, "stream": True})
            events, done = parse_sse(r.text)
            assert done
            return "".join(e["choices"][0]["text"] for e in events)

        texts = await asyncio.gather(*(one(p) for p in prompts))
    by_prompt = {r.prompt_token_ids: r for r in backend.requests}
    for prompt, text in zip(prompts, texts):
        assert text == tiny_tokenizer.decode(backend.output_for(by_prompt[tuple(prompt)]))
    assert sorted(backend.finished) == sorted(r.request_id for r in backend.requests)


@pytest.mark.slow
def test_mock_main_serves_over_http(tiny_llama_dir: Path) -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.gateway.mock",
            "--port",
            str(port),
            "--model",
            str(tiny_llama_dir),
            "--api-key",
            "k",
            "--token-delay-ms",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "mock_main did not become ready"
            time.sleep(0.2)
        name = tiny_llama_dir.name  # served name derived from the --model directory
        models = httpx.get(url + "/v1/models", headers={"authorization": "Bearer k"}).json()
        assert [m["id"] for m in models["data"]] == [name]
        r = httpx.post(
            url + "/v1/chat/completions",
            headers={"authorization": "Bearer k"},
            timeout=10,
            json={"model": name, "messages": MSG, "max_tokens": 4},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert httpx.post(url + "/v1/chat/completions", json={"messages": MSG}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout:
            proc.stdout.close()


async def test_build_app_from_a_resolved_gateway_config(tiny_llama_dir: Path) -> None:
    from services.gateway.server import build_app, served_names_of, uvicorn_config
    from shared.config.resolve import resolve
    from tests.services.gateway.conftest import client_for

    cfg = resolve(
        "gateway",
        [
            "--model",
            str(tiny_llama_dir),
            "--api-key",
            "k",
            "--max-request-bytes",
            "2048",
            "--port",
            "0",
            "--context-length",
            "64",
        ],
        env={},
    )
    primary, aliases = served_names_of(cfg)
    assert primary == tiny_llama_dir.name and aliases == [str(tiny_llama_dir)]
    backend = MockBackend([primary])
    app = build_app(cfg, backend)
    assert app.tokenizer.context_length == 64
    async with client_for(app, authorization="Bearer k") as c:
        r = await c.post("/v1/chat/completions", json={"model": str(tiny_llama_dir), "messages": MSG, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == primary
        assert (await c.post("/v1/completions", json={"prompt": "x" * 3000})).status_code == 413
        assert (await c.post("/v1/completions", json={"prompt": [5] * 70})).status_code == 400
    config = uvicorn_config(cfg, app)
    assert (config.host, config.port, config.access_log) == ("127.0.0.1", 0, False)
