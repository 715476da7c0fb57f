"""T3 in a real store process: a kvstore with a DRAM tier of 16 pages (no disk) over a real mooncake_master, next to
one worker with a pool of 16 pages. Pages pushed out of DRAM go to the Mooncake Store and come back on a hit; with
the master killed every request still answers (T1 serves, nothing hangs); a restarted master makes T3 work again.

The master and its metadata server bind 127.0.0.1; the store client's transfer engine binds every interface (Mooncake
does so; see the kvstore README)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto.pdrelay.v1 import worker_pb2
from shared.cluster.localcluster.servers import MooncakeMaster, free_port
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401
from tests.services.disagg.disagg_client import generate
from tests.services.disagg.disagg_procs import ServiceProc, Spec, stop_services
from tests.services.kvstore.kvstore_procs import STOP_TIMEOUT_S, KVStoreProc, start_engines, store_stats

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CLUSTER = "kvs-mc"


def _t3_pages(address: str) -> int:
    return sum(t.pages for t in store_stats(address).tiers if t.tier == worker_pb2.STORAGE_TIER_PEER)


def _until(pred, timeout_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(100)]


class Env:
    def __init__(self, master: MooncakeMaster, kv: KVStoreProc, worker: ServiceProc) -> None:
        self.master, self.kv, self.worker = master, kv, worker

    def run(self, rid: str, prompt: list[int]):  # type: ignore[no-untyped-def]
        return asyncio.run(generate(self.worker.grpc, rid, prompt, max_tokens=8))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("kvstore-mc")
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    master = MooncakeMaster(tmp / "mooncake", free_port(), start_timeout_s=60.0)
    master.start()
    kv = KVStoreProc(
        Spec(
            "kvstore",
            "kv-mc",
            CLUSTER,
            (
                "--kvstore-dram-bytes",
                "128KiB",
                "--kvstore-high-watermark",
                "0.5",
                "--kvstore-chunk-pages",
                "4",
                "--kvstore-mooncake-master",
                master.address,
                "--kvstore-mooncake-metadata-url",
                master.metadata_url,
                "--kvstore-mooncake-segment-bytes",
                "16MiB",
                "--kvstore-mooncake-timeout-s",
                "3",  # a put that times out drops its chunk: leave room for a loaded machine
            ),
        ),
        tmp,
        etcd,
        nats,
    )
    procs: dict[str, ServiceProc] = {}
    try:
        kv.wait_ready()
        # the store answers before its Mooncake client has connected (T3 is optional); pages evicted before then are
        # dropped, so on a loaded machine the first requests could demote nothing
        assert _until(lambda: "Mooncake Store tier T3" in kv.log(), 60.0), kv.log()[-2000:]
        procs = start_engines(
            tmp,
            etcd,
            nats,
            tiny_llama_dir,
            [Spec("worker", "wmc", CLUSTER, ("--num-pages", "16", "--kvstore-load-timeout-s", "3"))],
        )
        yield Env(master, kv, procs["wmc"])
    finally:
        stop_services([*procs.values(), kv], timeout=STOP_TIMEOUT_S)
        master.stop()
        nats.stop()
        etcd.stop()


def test_t3_serves_evicted_pages_survives_a_dead_master_and_comes_back(env: Env) -> None:
    a, b, c = _prompt(21), _prompt(22), _prompt(23)
    first = {k: env.run(f"m-{k}", p) for k, p in (("a", a), ("b", b), ("c", c))}
    assert _until(lambda: _t3_pages(env.kv.grpc) >= 8), f"nothing demoted to the Mooncake Store: {env.kv.log()[-2000:]}"
    # a is out of the worker's pool and out of the store's DRAM (it keeps 8 slots, the newest): only T3 holds it
    again = env.run("m-a2", a)
    assert again.tokens == first["a"].tokens
    assert again.usage.cached_tokens == 96, "a's pages did not come back from the Mooncake Store"

    # the master dies: requests still answer, from compute and T1, within their usual bounds
    env.master.kill()
    t0 = time.monotonic()
    d = _prompt(24)
    env.run("m-d", d)
    assert env.run("m-b2", b).tokens == first["b"].tokens
    assert env.run("m-c2", c).tokens == first["c"].tokens
    assert time.monotonic() - t0 < 60.0

    # a restarted (empty) master: new pages reach T3 again and are served from it
    env.master.start()
    served = False
    for attempt in range(6):
        ps = [_prompt(100 + 10 * attempt + i) for i in range(4)]
        outs = [env.run(f"m-r{attempt}-{i}", p) for i, p in enumerate(ps)]
        back = env.run(f"m-r{attempt}-again", ps[0])
        assert back.tokens == outs[0].tokens
        if back.usage.cached_tokens == 96:
            served = True
            break
        time.sleep(2.0)  # the client reconnects to the master on its own ping cycle
    assert served, "the Mooncake Store tier did not come back after the master restarted"
