"""The kvstore at --tp-size 2, real processes (etcd, NATS, gRPC, NIXL) on the tiny Llama (2 KV heads: one per rank):

    kv            kvstore, 64 MiB DRAM
    w-tp1, w-tp2  colocated workers at --tp-size 1 and 2, both using the store

Pages travel in one TP-independent layout (all KV heads: shared/engine/parallel/kv_exchange.py), so what a TP=2
worker stored, a TP=1 worker loads, and the other way round, under the same keys and layout; each answer is the
colocated TP=1 engine's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401
from tests.services.disagg.disagg_client import generate
from tests.services.disagg.disagg_procs import ServiceProc, Spec, stop_services
from tests.services.kvstore.kvstore_procs import STOP_TIMEOUT_S, KVStoreProc, start_engines, store_stats

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CLUSTER = "kvs-tp"
P = 16  # page size
NEW = 8
ENGINE = ("--num-pages", "64", "--kvstore-load-timeout-s", "3")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[dict[str, ServiceProc]]:
    tmp = tmp_path_factory.mktemp("kvstore-tp")
    etcd = start_etcd(tmp)
    nats = start_nats(tmp)
    kv = KVStoreProc(Spec("kvstore", "kv", CLUSTER, ("--kvstore-dram-bytes", "64MiB")), tmp, etcd, nats)
    procs: dict[str, ServiceProc] = {}
    try:
        kv.wait_ready()
        specs = [
            Spec("worker", "w-tp1", CLUSTER, ENGINE),
            Spec("worker", "w-tp2", CLUSTER, (*ENGINE, "--tp-size", "2")),
        ]
        procs = start_engines(tmp, etcd, nats, tiny_llama_dir, specs)
        yield {"kv": kv, **procs}
    finally:
        alive = {iid for iid, p in [*procs.items(), (kv.instance_id, kv)] if p.alive()}
        codes = stop_services([*procs.values(), kv], timeout=STOP_TIMEOUT_S)
        nats.stop()
        etcd.stop()
    bad = {iid: c for iid, c in codes.items() if iid in alive and c != 0}
    assert not bad, f"services must exit 0 on SIGTERM: {bad}"


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def _reference(model_dir: Path, prompt: list[int]) -> list[int]:
    """The colocated TP=1 engine's greedy tokens (in-process)."""
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.modelspec.sampling import SamplingParams

    engine = Engine.from_config(resolve("worker", ["--model", str(model_dir), *ENGINE[:2], "--threads", "1"], env={}))
    return list(
        engine.generate([prompt], SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True))[0].token_ids
    )


def _run(proc: ServiceProc, rid: str, prompt: list[int]):
    return asyncio.run(generate(proc.grpc, rid, prompt, max_tokens=NEW))


def _wait_stored(kv: ServiceProc, at_least: int, timeout_s: float = 30.0) -> int:
    """Stores run in the background after a request: the store's page count once it holds `at_least`."""
    deadline = time.monotonic() + timeout_s
    while True:
        n = store_stats(kv.grpc).stored_pages
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("saver", "loader", "seed"), [("w-tp2", "w-tp1", 1), ("w-tp1", "w-tp2", 2)], ids=["tp2-to-tp1", "tp1-to-tp2"]
)
def test_pages_stored_at_one_tp_size_load_at_another(
    cluster: dict[str, ServiceProc], tiny_llama_dir: Path, saver: str, loader: str, seed: int
) -> None:
    kv = cluster["kv"]
    prompt = _prompt(seed, 100)  # 6 loadable pages (the last token is always computed)
    reference = _reference(tiny_llama_dir, prompt)
    before = store_stats(kv.grpc)
    first = _run(cluster[saver], f"{saver}-save", prompt)
    assert first.usage is not None and first.usage.cached_tokens == 0
    assert first.tokens == reference, f"{saver} differs from the colocated TP=1 engine"
    assert _wait_stored(kv, before.stored_pages + 6) >= before.stored_pages + 6, f"{saver} stored no pages"
    second = _run(cluster[loader], f"{loader}-load", prompt)
    assert second.usage is not None and second.usage.cached_tokens == 6 * P, "the pages did not come from the store"
    assert second.tokens == reference, f"{loader} over pages {saver} stored differs from the colocated TP=1 engine"
    after = store_stats(kv.grpc)
    assert after.get_pages - before.get_pages == 6
    assert after.layout.num_kv_heads == 2  # the one layout every TP size shares: all KV heads
