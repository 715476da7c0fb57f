"""The kvstore in a real cluster: a store, colocated workers, a decode + prefill pair, all real processes (etcd,
NATS, gRPC, NIXL) on the tiny Llama.

    kv      kvstore, 64 MiB DRAM
    wa, wb  workers using the store;  w-off  a worker with --kvstore-use off (the reference output)
    d1, p1  decode + prefill using the store

What is checked: a prompt computed on one instance is loaded by another (usage.cached_tokens) with the same greedy
output as without the store; a finished conversation (prompt + generated) is found by its next turn on any
instance, also through prefill; a foreign layout is refused; a corrupted DRAM page is detected, dropped and
recomputed (counted); a store that stops answering mid-load, then dies, costs at most the load deadline.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from shared.cluster.grpc_errors import error_from_rpc
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401
from tests.services.disagg.disagg_client import generate
from tests.services.disagg.disagg_procs import ServiceProc, Spec, stop_services
from tests.services.kvstore.kvstore_procs import STOP_TIMEOUT_S, KVStoreProc, start_engines, store_stats

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CLUSTER = "kvs"
P = 16  # page size
ENGINE = ("--num-pages", "64", "--kvstore-load-timeout-s", "3")


class Cluster:
    def __init__(self, kv: KVStoreProc, procs: dict[str, ServiceProc]) -> None:
        self.kv = kv
        self.procs = procs

    def __getitem__(self, name: str) -> ServiceProc:
        return self.procs[name]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("kvstore")
    etcd = start_etcd(tmp)
    nats = start_nats(tmp)
    kv = KVStoreProc(Spec("kvstore", "kv", CLUSTER, ("--kvstore-dram-bytes", "64MiB")), tmp, etcd, nats)
    procs: dict[str, ServiceProc] = {}
    try:
        kv.wait_ready()
        procs = start_engines(
            tmp,
            etcd,
            nats,
            tiny_llama_dir,
            [
                Spec("worker", "wa", CLUSTER, ENGINE),
                Spec("worker", "wb", CLUSTER, ENGINE),
                Spec("worker", "w-off", CLUSTER, (*ENGINE, "--kvstore-use", "off")),
                Spec("decode", "d1", CLUSTER, ENGINE),
                Spec("prefill", "p1", CLUSTER, ENGINE),
            ],
        )
        yield Cluster(kv, procs)
    finally:
        alive = {iid for iid, p in [*procs.items(), (kv.instance_id, kv)] if p.alive()}
        codes = stop_services([*procs.values(), kv], timeout=STOP_TIMEOUT_S)
        nats.stop()
        etcd.stop()
    bad = {iid: c for iid, c in codes.items() if iid in alive and c != 0}
    assert not bad, f"engine services must exit 0 on SIGTERM: {bad}"


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def _run(proc: ServiceProc, rid: str, prompt: list[int], max_tokens: int = 8, *, prefill: ServiceProc | None = None):
    return asyncio.run(
        generate(
            proc.grpc, rid, prompt, max_tokens=max_tokens, prefill=prefill.target() if prefill is not None else None
        )
    )


def _wait_stored(cl: Cluster, at_least: int, timeout_s: float = 20.0) -> worker_pb2.KVStoreStatsResponse:
    """Stores run in the background after a request: wait until the store holds that many pages."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = store_stats(cl.kv.grpc)
        if s.stored_pages >= at_least or time.monotonic() > deadline:
            return s
        time.sleep(0.1)


def test_a_prompt_computed_once_is_loaded_elsewhere_with_the_same_output(cluster: Cluster) -> None:
    prompt = _prompt(1, 100)  # 6 loadable pages (the last token is always computed)
    first = _run(cluster["wa"], "t1-a", prompt)
    assert first.usage.cached_tokens == 0
    before = _wait_stored(cluster, 6)
    assert before.stored_pages >= 6
    second = _run(cluster["wb"], "t1-b", prompt)
    reference = _run(cluster["w-off"], "t1-off", prompt)
    assert second.usage.cached_tokens == 6 * P  # from the store: wb never saw this prompt
    assert first.tokens == second.tokens == reference.tokens  # the store never changes an answer
    assert reference.usage.cached_tokens == 0
    after = store_stats(cluster.kv.grpc)
    assert after.get_pages - before.get_pages == 6 and after.model and after.layout.page_size == P
    dram = [t for t in after.tiers if t.tier == worker_pb2.STORAGE_TIER_DRAM][0]
    assert dram.pages >= 6 and dram.used_bytes == dram.pages * _page_bytes(after)


def _page_bytes(s: worker_pb2.KVStoreStatsResponse) -> int:
    lay = s.layout
    return lay.num_layers * 2 * lay.page_size * lay.num_kv_heads * lay.head_dim * 4


def test_the_next_turn_finds_the_whole_history_through_decode_and_prefill(cluster: Cluster) -> None:
    turn1 = _prompt(2, 60)
    out1 = _run(cluster["d1"], "t2-1", turn1, max_tokens=40, prefill=cluster["p1"])
    history = turn1 + out1.tokens  # 100 tokens, of which 99 have KV at decode
    _wait_stored(cluster, store_stats(cluster.kv.grpc).stored_pages + 1)
    time.sleep(0.5)  # decode's store of the finished request follows prefill's store of the prompt
    turn2 = history + _prompt(3, 20)
    # another instance that never saw turn 1: loads prompt *and* generated pages from the store
    on_wb = _run(cluster["wb"], "t2-wb", turn2)
    assert on_wb.usage.cached_tokens >= (len(history) - 1) // P * P
    # the same pair again: prefill holds turn 1's prompt pages, the store adds the generated ones
    on_pd = _run(cluster["d1"], "t2-pd", turn2, prefill=cluster["p1"])
    reference = _run(cluster["w-off"], "t2-off", turn2)
    assert on_wb.tokens == on_pd.tokens == reference.tokens
    assert on_pd.usage.cached_tokens >= (len(history) - 1) // P * P  # prefill's cache and the store, not recomputed
    ref1 = _run(cluster["w-off"], "t2-off1", turn1, max_tokens=40)
    assert ref1.tokens == out1.tokens


def test_disaggregated_usage_counts_the_prompt_tokens_prefill_did_not_compute(cluster: Cluster) -> None:
    """usage.cached_tokens on the prefill -> decode path is prefill's count (what it loaded from the store or found
    in its prefix cache), not decode's own prefix-cache hit: decode never saw this prompt."""
    prompt = _prompt(8, 100)  # 6 loadable pages
    stored = store_stats(cluster.kv.grpc).stored_pages
    on_wa = _run(cluster["wa"], "t8-wa", prompt)
    _wait_stored(cluster, stored + 6)
    from_store = _run(cluster["d1"], "t8-pd1", prompt, prefill=cluster["p1"])
    assert from_store.usage.cached_tokens == 6 * P
    from_prefix_cache = _run(cluster["d1"], "t8-pd2", prompt, prefill=cluster["p1"])
    assert from_prefix_cache.usage.cached_tokens == 6 * P
    assert on_wa.tokens == from_store.tokens == from_prefix_cache.tokens


def test_a_foreign_layout_is_refused(cluster: Cluster) -> None:
    async def lookup(layout: common_pb2.KVLayout, model: str) -> common_pb2.Error | None:
        async with grpc.aio.insecure_channel(cluster.kv.grpc) as ch:
            try:
                await worker_pb2_grpc.KVStoreStub(ch).Lookup(
                    worker_pb2.LookupRequest(block_hashes=[1, 2], layout=layout, model=model), timeout=5
                )
            except grpc.aio.AioRpcError as e:
                return error_from_rpc(e)
        return None

    s = store_stats(cluster.kv.grpc)
    other = common_pb2.KVLayout()
    other.CopyFrom(s.layout)
    other.page_size = 32
    err = asyncio.run(lookup(other, s.model))
    assert err is not None and err.code == common_pb2.ERROR_CODE_LAYOUT_MISMATCH and "page size 32" in err.message
    err = asyncio.run(lookup(s.layout, "another-model"))
    assert err is not None and err.code == common_pb2.ERROR_CODE_LAYOUT_MISMATCH
    assert asyncio.run(lookup(s.layout, s.model)) is None


def _arena_base(cluster: Cluster) -> int:
    """Where the store's DRAM arena starts, from a phase-1 put it hands out (aborted at once)."""
    s = store_stats(cluster.kv.grpc)

    async def call() -> int:
        async with grpc.aio.insecure_channel(cluster.kv.grpc) as ch:
            stub = worker_pb2_grpc.KVStoreStub(ch)
            res = await stub.Put(
                worker_pb2.PutPagesRequest(
                    block_hashes=[12345], layout=s.layout, model=s.model, backend=common_pb2.TRANSFER_BACKEND_NIXL
                ),
                timeout=5,
            )
            await stub.CommitPut(worker_pb2.CommitPutRequest(put_id=res.put_id, abort=True), timeout=5)
            return res.slots.paged.base_address

    return asyncio.run(call())


def test_a_corrupted_dram_page_is_detected_dropped_and_recomputed(cluster: Cluster) -> None:
    prompt = _prompt(4, 100)
    ref = _run(cluster["wa"], "t4-a", prompt)
    s0 = _wait_stored(cluster, store_stats(cluster.kv.grpc).stored_pages + 6)
    # flip bytes all over the arena's used part from outside the process (a DRAM fault)
    base = _arena_base(cluster)
    used = [t for t in s0.tiers if t.tier == worker_pb2.STORAGE_TIER_DRAM][0].used_bytes
    with open(f"/proc/{cluster.kv.proc.pid}/mem", "r+b", buffering=0) as mem:
        for off in range(0, used + 64 * _page_bytes(s0), _page_bytes(s0)):
            mem.seek(base + off + 100)
            b = mem.read(1)
            mem.seek(base + off + 100)
            mem.write(bytes([b[0] ^ 0xFF]))
    out = _run(cluster["wb"], "t4-b", prompt)
    assert out.tokens == ref.tokens
    assert out.usage.cached_tokens == 0  # the first page was corrupt: nothing loaded, all computed
    s1 = store_stats(cluster.kv.grpc)
    assert s1.corrupt_pages >= 1  # counted (also on /metrics: pdrelay:kvstore_corrupt_pages)


def test_a_store_that_hangs_then_dies_mid_load_costs_at_most_the_deadline(cluster: Cluster) -> None:
    prompt = _prompt(5, 100)
    ref = _run(cluster["wa"], "t5-a", prompt)
    _wait_stored(cluster, store_stats(cluster.kv.grpc).stored_pages + 6)
    os.kill(cluster.kv.proc.pid, signal.SIGSTOP)  # the store stops answering in the middle of everything
    try:
        t0 = time.monotonic()
        out = _run(cluster["wb"], "t5-b", prompt)
        took = time.monotonic() - t0
    finally:
        cluster.kv.kill()  # SIGKILL while stopped: its connections die with it
    assert out.tokens == ref.tokens and out.usage.cached_tokens == 0
    assert took < 3.0 + 10.0  # the load deadline (--kvstore-load-timeout-s 3) plus computing on a busy box
    again = _run(cluster["wb"], "t5-c", _prompt(6, 100))  # a dead store: fails fast, computes
    assert again.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert "kvstore" in cluster["wb"].log() and cluster["wb"].alive()
