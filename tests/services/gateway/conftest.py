"""Gateway test fixtures: a tiny trained tokenizer, the mock backend, the ASGI app and an in-process client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from services.gateway.http.app import GatewayApp
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import GatewayTokenizer
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)

MODEL = "tiny"


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama_dir: Path) -> GatewayTokenizer:
    return GatewayTokenizer.from_dir(tiny_llama_dir)


@pytest.fixture
def backend(tiny_tokenizer: GatewayTokenizer) -> MockBackend:
    return MockBackend([MODEL], vocab_size=tiny_tokenizer.vocab_size)


AppFactory = Callable[..., GatewayApp]


@pytest.fixture
def make_app(tiny_tokenizer: GatewayTokenizer, backend: MockBackend) -> AppFactory:
    def make(**kw: object) -> GatewayApp:
        kw.setdefault("backend", backend)
        kw.setdefault("tokenizer", tiny_tokenizer)
        kw.setdefault("served_model_names", [MODEL])
        return GatewayApp(**kw)  # type: ignore[arg-type]

    return make


@pytest.fixture
def app(make_app: AppFactory) -> GatewayApp:
    return make_app()


def client_for(app: GatewayApp, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=headers, timeout=10.0
    )


@pytest.fixture
async def client(app: GatewayApp) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(app) as c:
        yield c
