"""Gateway test fixtures: a tiny trained tokenizer, the mock backend, the ASGI app and an in-process client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from services.gateway.backends.encoder_backend import EmbedCall, EmbedResult
from services.gateway.http.app import GatewayApp
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.cluster.instance import EncoderInfo
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


class StandInEncoders:
    """Stands in for the encoder fleet only (the gateway's validation and answer encoding are the real ones): one
    embedding model, vectors of the requested dimensions."""

    class router:  # the attribute EncoderBackend has
        @staticmethod
        def embedding_models() -> dict[str, EncoderInfo]:
            return {"mini": EncoderInfo(embedding_model="mini", embedding_dim=8)}

    async def embed(self, call: EmbedCall) -> EmbedResult:
        rows = max(len(call.texts), len(call.token_inputs))
        tokens = sum(len(t.split()) + 2 for t in call.texts) + sum(len(t) for t in call.token_inputs)
        # The stand-in's vectors are at most 64 wide: the fuzzer's large `dimensions` values (10^3 .. 10^9) would
        # otherwise make it allocate rows x dimensions floats; what is checked is the gateway's side, not the width.
        return EmbedResult(np.ones((rows, min(call.dimensions or 8, 64)), np.float32), tokens, "enc-0", 1)
