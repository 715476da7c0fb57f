"""The colocated worker's transfer engine for the kvstore: built as soon as a store shows up (not by the first
request that loads or stores, beside the engine threads serving it), and a failed build turns the store off for
this client instead of failing requests."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from shared.config.groups import KVStoreClientConfig
from shared.serving import kvstore_client as kc
from shared.transfer.errors import TransferError

STORE = SimpleNamespace(instance_id="kvstore-1", epoch=1, transfer_backend="nixl")


class _Transfer:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.progressing = False

    def start_progress(self) -> None:
        self.progressing = True


def _client(monkeypatch: Any, make: Any) -> tuple[kc.KVStoreClient, list[Any]]:
    client = kc.KVStoreClient.__new__(kc.KVStoreClient)
    client.cfg = KVStoreClientConfig()
    client.instance_id = "worker-1"
    client.transfer = None
    client.make_transfer = make
    client._making = None
    client._bg = set()
    client._warmed = set()
    warmed: list[Any] = []
    monkeypatch.setattr(client, "_pick", lambda: STORE)
    monkeypatch.setattr(client, "_warm", lambda m, t: warmed.append((m.instance_id, t)))
    return client, warmed


async def test_a_store_showing_up_builds_the_transfer_engine_before_any_request(monkeypatch: Any) -> None:
    built: list[str] = []

    def make(backend: str) -> _Transfer:
        built.append(backend)
        return _Transfer(backend)

    client, warmed = _client(monkeypatch, make)
    client._warm_ready()
    client._warm_ready()  # a second membership event while the first build runs: still one build
    await asyncio.wait_for(asyncio.gather(*client._bg), 5.0)
    assert built == ["nixl"]
    assert isinstance(client.transfer, _Transfer) and client.transfer.progressing
    assert warmed == [("kvstore-1", client.transfer)]  # and the store learns our endpoint right away
    assert await client._transfer_for(STORE) is client.transfer  # a request then finds it built


async def test_a_failed_build_turns_the_store_off_here_without_failing_requests(
    monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def make(backend: str) -> _Transfer:
        nonlocal calls
        calls += 1
        raise TransferError(f"no {backend} plugin")

    client, warmed = _client(monkeypatch, make)
    with caplog.at_level(logging.WARNING, logger=kc.__name__):
        client._warm_ready()
        await asyncio.wait_for(asyncio.gather(*client._bg), 5.0)
        assert await client._transfer_for(STORE) is None  # what load() and the stores see: no store
    assert calls == 1 and client.transfer is None and warmed == []
    assert [r.getMessage() for r in caplog.records] == ["worker-1: no kvstore: its nixl agent failed: no nixl plugin"]
