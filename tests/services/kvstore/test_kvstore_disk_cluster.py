"""The disk tier in a real store process: a DRAM tier of 16 pages demotes to chunk files, a hit promotes them
back, a restarted store rebuilds its index from disk, and corrupted chunk data is caught on the way to the engine.
One worker with a pool of 16 pages, so a third prompt pushes the first out of its own cache."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto.pdrelay.v1 import worker_pb2
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401
from tests.services.disagg.disagg_client import generate
from tests.services.disagg.disagg_procs import ServiceProc, Spec, stop_services
from tests.services.kvstore.kvstore_procs import STOP_TIMEOUT_S, KVStoreProc, start_engines, store_stats

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CLUSTER = "kvs-disk"


def _disk_pages(address: str) -> int:
    return sum(t.pages for t in store_stats(address).tiers if t.tier == worker_pb2.STORAGE_TIER_DISK)


def _until(pred, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class Env:
    def __init__(self, tmp: Path, etcd, nats, spec: Spec) -> None:  # type: ignore[no-untyped-def]
        self.tmp, self.etcd, self.nats, self.spec = tmp, etcd, nats, spec
        self.kv = self.start_store()
        self.worker: ServiceProc | None = None

    def start_store(self) -> KVStoreProc:
        kv = KVStoreProc(self.spec, self.tmp, self.etcd, self.nats)
        kv.wait_ready()
        return kv

    def run(self, rid: str, prompt: list[int]):  # type: ignore[no-untyped-def]
        assert self.worker is not None
        return asyncio.run(generate(self.worker.grpc, rid, prompt, max_tokens=8))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("kvstore-disk")
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    spec = Spec(
        "kvstore",
        "kv-d",
        CLUSTER,
        (
            "--kvstore-dram-bytes",
            "128KiB",
            "--kvstore-high-watermark",
            "0.5",
            "--kvstore-disk-dir",
            str(tmp / "disk"),
            "--kvstore-chunk-pages",
            "4",
        ),
    )
    e = Env(tmp, etcd, nats, spec)
    procs: dict[str, ServiceProc] = {}
    try:
        procs = start_engines(
            tmp,
            etcd,
            nats,
            tiny_llama_dir,
            [Spec("worker", "wd", CLUSTER, ("--num-pages", "16", "--kvstore-load-timeout-s", "3"))],
        )
        e.worker = procs["wd"]
        yield e
    finally:
        stop_services([*procs.values(), e.kv], timeout=STOP_TIMEOUT_S)
        nats.stop()
        etcd.stop()


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(100)]


def test_demotion_promotion_restart_and_corruption(env: Env) -> None:
    a, b, c = _prompt(11), _prompt(12), _prompt(13)
    first = {}
    for i, (k, p) in enumerate((("a", a), ("b", b), ("c", c))):
        first[k] = env.run(f"d-{k}", p)
        # each conversation's 6 full pages stored (and so unpinned) before the next request: a store still reading
        # a's pages would keep them in the worker's pool when c needs room, and b's would go instead
        assert _until(lambda n=6 * (i + 1): store_stats(env.kv.grpc).stored_pages >= n)
    assert _until(lambda: _disk_pages(env.kv.grpc) >= 8)  # DRAM keeps half its 16 slots: the rest went to disk
    # a is out of the worker's pool (c pushed it out) and its pages are the store's oldest: on disk
    again = env.run("d-a2", a)
    assert again.usage.cached_tokens == 96 and again.tokens == first["a"].tokens
    s = store_stats(env.kv.grpc)
    assert s.get_pages >= 1  # some of a may still be in the pool; the rest came from the store (disk)
    # a restart rebuilds the index from the chunk files: the store serves its namespace at once
    disk_before = _disk_pages(env.kv.grpc)
    assert stop_services([env.kv], timeout=STOP_TIMEOUT_S)[env.kv.instance_id] == 0
    env.kv = env.start_store()
    s = store_stats(env.kv.grpc)
    assert s.model and _disk_pages(env.kv.grpc) >= min(disk_before, 4)
    # corrupt the page data of every chunk while the store is down; the next load finds it and computes instead
    assert stop_services([env.kv], timeout=STOP_TIMEOUT_S)[env.kv.instance_id] == 0
    for chunk in (env.tmp / "disk").glob("chunk-*.kv"):
        data = bytearray(chunk.read_bytes())
        for off in range(len(data) - 8192 + 100, 0, -8192)[:4]:
            data[off] ^= 0xFF
        chunk.write_bytes(bytes(data))
    env.kv = env.start_store()
    out = env.run("d-b2", b)  # b: evicted from the worker's pool by a and c
    assert out.tokens == first["b"].tokens  # never a wrong answer from a damaged page
    assert store_stats(env.kv.grpc).corrupt_pages >= 1  # detected, dropped and counted
