"""The model families beyond Llama/Qwen (windowed, Gemma, mixture-of-experts) served by real processes on every path, against transformers: colocated, a
prefill -> decode hand-off over NIXL, and pages that went through the kvstore and were loaded by an instance that
never saw the prompt.

Per family, one cluster (a kvstore, a prefill + decode pair and a worker, all using the store) on a tiny random
checkpoint with a 6-token sliding window (Gemma and gpt-oss: alternating local and global layers; the MoE families:
8 experts top-2), 9 query heads over 3 KV heads.
The prompts are 40 and 100 tokens, far past the window, so windowed attention runs on every path. The in-process
parity per family is tests/shared/engine/test_model_families.py; the byte-exactness of the store's tiers is
tier_round_trip.py's."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import FAMILIES, MOE_FAMILIES, make_tiny_model
from tests.services.disagg.disagg_client import Result, generate
from tests.services.disagg.disagg_procs import ServiceProc, Spec, stop_services
from tests.services.kvstore.kvstore_procs import STOP_TIMEOUT_S, KVStoreProc, start_engines, store_stats

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

P = 16  # page size
NEW = 8
ENGINE = ("--num-pages", "48", "--page-size", str(P), "--kvstore-load-timeout-s", "5")


@dataclass
class FamilyCluster:
    family: str
    model_dir: Path
    kv: KVStoreProc
    procs: dict[str, ServiceProc]


@pytest.fixture(scope="module", params=FAMILIES + MOE_FAMILIES)
def fam(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FamilyCluster]:
    family = request.param
    tmp = tmp_path_factory.mktemp(f"served-{family}")
    model = make_tiny_model(tmp, family, hidden=72, heads=9, kv_heads=3)
    etcd = start_etcd(tmp)
    nats = start_nats(tmp)
    kv = KVStoreProc(Spec("kvstore", "kv", family, ("--kvstore-dram-bytes", "16MiB")), tmp, etcd, nats)
    procs: dict[str, ServiceProc] = {}
    try:
        kv.wait_ready()
        specs = [Spec("prefill", "p1", family, ENGINE), Spec("decode", "d1", family, ENGINE)]
        procs = start_engines(tmp, etcd, nats, model, [*specs, Spec("worker", "w1", family, ENGINE)])
        yield FamilyCluster(family, model, kv, procs)
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


def _hf_greedy(model_dir: Path, prompt: list[int]) -> list[int]:
    """Each step recomputes the whole sequence in transformers (eager attention: Gemma's soft-capping is eager's)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(  # eager experts too: transformers' grouped path wants aligned sizes
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def _run(proc: ServiceProc, rid: str, prompt: list[int], prefill: ServiceProc | None = None) -> Result:
    target = prefill.target() if prefill is not None else None
    return asyncio.run(generate(proc.grpc, rid, prompt, max_tokens=NEW, prefill=target))


def _wait_stored(kv: KVStoreProc, at_least: int, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = store_stats(kv.grpc).stored_pages
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def test_colocated_disaggregated_and_stored_pages_answer_as_transformers(fam: FamilyCluster) -> None:
    short, long = _prompt(1, 40), _prompt(2, 100)  # the long one: 6 whole pages the store can hold
    ref_short, ref_long = _hf_greedy(fam.model_dir, short), _hf_greedy(fam.model_dir, long)

    colocated = _run(fam.procs["w1"], "colo", short)
    assert colocated.tokens == ref_short, f"{fam.family}: colocated differs from transformers"

    disagg = _run(fam.procs["d1"], "pd", long, prefill=fam.procs["p1"])
    assert disagg.prefill_instance_id == "p1", f"{fam.family}: decode computed the prompt itself"
    assert disagg.tokens == ref_long, f"{fam.family}: disaggregated differs from transformers"

    # the prefill stored the prompt's pages; the worker, which never saw this prompt, loads them from the store
    assert _wait_stored(fam.kv, 6) >= 6
    loaded = _run(fam.procs["w1"], "loaded", long)
    assert loaded.usage is not None and loaded.usage.cached_tokens == 6 * P, (
        f"{fam.family}: nothing came from the store"
    )
    assert loaded.tokens == ref_long, f"{fam.family}: pages loaded from the kvstore change the answer"
