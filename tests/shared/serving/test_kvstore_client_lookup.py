"""KVStoreClient.load asks the store before the engine: a store miss never waits on the engine thread (whose
answer comes only between steps), and a hit loads only what continues the engine's own prefix."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from proto.pdrelay.v1 import worker_pb2
from shared.config.groups import KVStoreClientConfig
from shared.serving import kvstore_client as kc
from shared.serving import kvstore_pages

PAGE = 4


class _Stub:
    def __init__(self, hit: int) -> None:
        self.hit = hit
        self.lookups: list[list[int]] = []

    async def Lookup(self, req: worker_pb2.LookupRequest, timeout: float) -> worker_pb2.LookupResponse:
        self.lookups.append(list(req.block_hashes))
        return worker_pb2.LookupResponse(num_hit_pages=self.hit)


class _Engine:
    """Counts the calls that would have run on the engine thread."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, fn: Any) -> Any:
        self.calls += 1
        return fn()


def _client(monkeypatch: Any, hit: int, local: int) -> tuple[kc.KVStoreClient, _Stub, _Engine, list[tuple[int, int]]]:
    client = kc.KVStoreClient.__new__(kc.KVStoreClient)
    client.cfg = KVStoreClientConfig()
    client.page_size = PAGE
    client.layout = None
    client.model = "m"
    client.telemetry = None
    client.lookups = 0
    client.load_failures = 0
    client.engine = object()
    aengine = _Engine()
    client.aengine = aengine  # type: ignore[assignment]
    stub = _Stub(hit)
    gets: list[tuple[int, int]] = []

    async def transfer_for(_m: Any) -> Any:
        return object()

    async def get(rid: str, stub: Any, store: Any, transfer: Any, prompt: Any, hashes: Any, lo: int, n: int, *a: Any):
        gets.append((lo, n))
        return "loaded", n

    monkeypatch.setattr(client, "_pick", lambda: SimpleNamespace(instance_id="kvstore-1"))
    monkeypatch.setattr(client, "_transfer_for", transfer_for)
    monkeypatch.setattr(client, "_stub", lambda _m: stub)
    monkeypatch.setattr(client, "_get", get)
    monkeypatch.setattr(kc, "layout_to_pb", lambda _layout: None)
    monkeypatch.setattr(kvstore_pages, "local_prefix", lambda _e, _t, hashes: min(local, len(hashes)))
    return client, stub, aengine, gets


async def test_store_miss_never_waits_on_the_engine(monkeypatch: Any) -> None:
    client, stub, aengine, gets = _client(monkeypatch, hit=0, local=0)
    assert await client.load("r", list(range(10 * PAGE + 1))) == 0
    assert aengine.calls == 0 and gets == []
    assert len(stub.lookups) == 1 and len(stub.lookups[0]) == 10  # the whole prompt's full pages


async def test_hit_loads_what_continues_the_local_prefix(monkeypatch: Any) -> None:
    client, _stub, aengine, gets = _client(monkeypatch, hit=7, local=3)
    assert await client.load("r", list(range(10 * PAGE + 1))) == 4
    assert aengine.calls == 1 and gets == [(3, 4)]  # pages [3, 7): the store's run past the engine's own


async def test_hit_the_engine_already_holds_is_not_loaded(monkeypatch: Any) -> None:
    client, _stub, aengine, gets = _client(monkeypatch, hit=5, local=4)
    assert await client.load("r", list(range(10 * PAGE + 1))) == 0  # 1 page beyond: under --kvstore-min-pages
    assert aengine.calls == 1 and gets == []
