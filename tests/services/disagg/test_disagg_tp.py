"""Prefill and decode at different tensor-parallel sizes, real processes (etcd, NATS, gRPC, NIXL), the tiny Llama
(4 attention heads, 2 KV heads: one per rank at TP=2):

    p-tp1, p-tp2   prefill at --tp-size 1 and 2
    d-tp1, d-tp2   decode at --tp-size 1 and 2

A TP=2 prefill hands off to a TP=1 decode, a TP=1 prefill to a TP=2 decode, and TP=2 to TP=2: 8 prompts at once each
time, every greedy answer the colocated TP=1 engine's, the prompt KV from the named prefill (the pages move in the
one layout every TP size shares, checksummed over their full-head bytes: shared/engine/parallel/kv_exchange.py),
and no page leaked on any instance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from proto.pdrelay.v1 import common_pb2
from tests.services.disagg.disagg_client import Loads, generate_all, mixed_prompts
from tests.services.disagg.disagg_procs import NUM_PAGES, Servers, ServiceProc, Spec, start_services, stop_services

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "pd-tp"
NEW = 12
VOCAB = 512  # the tiny model's


@pytest.fixture(scope="module")
def tp_cluster(servers: Servers) -> Iterator[dict[str, ServiceProc]]:
    common = ("--transfer-backend", "nixl", *NUM_PAGES)
    tp2 = ("--tp-size", "2")
    specs = [
        Spec("prefill", "p-tp1", CLUSTER, common),
        Spec("prefill", "p-tp2", CLUSTER, (*common, *tp2)),
        Spec("decode", "d-tp1", CLUSTER, common),
        Spec("decode", "d-tp2", CLUSTER, (*common, *tp2)),
    ]
    procs = start_services(servers.tmp, servers.etcd, servers.nats, servers.model_dir, specs)
    try:
        yield procs
    finally:
        alive = {iid for iid, p in procs.items() if p.alive()}
        codes = stop_services(procs.values())
    bad = {iid: c for iid, c in codes.items() if iid in alive and c != 0}
    assert not bad, f"services must exit 0 on SIGTERM: {bad}"


@pytest.fixture(scope="module")
def colocated(servers: Servers) -> Callable[[list[list[int]]], list[list[int]]]:
    """The colocated TP=1 engine's greedy tokens (the worker's engine, in-process)."""
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.modelspec.sampling import SamplingParams

    args = ["--model", str(servers.model_dir), *NUM_PAGES, "--threads", "1"]
    engine = Engine.from_config(resolve("worker", args, env={}))
    greedy = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    return lambda prompts: [list(c.token_ids) for c in engine.generate(prompts, greedy)]


# each pair its own prompts (seed): a decode's prefix cache holding a prompt from an earlier pair would shorten the
# hand-off to the prompt's last page
@pytest.mark.parametrize(
    ("prefill_id", "decode_id", "seed"),
    [("p-tp2", "d-tp1", 1), ("p-tp1", "d-tp2", 2), ("p-tp2", "d-tp2", 3)],
    ids=["tp2-to-tp1", "tp1-to-tp2", "tp2-to-tp2"],
)
async def test_hand_off_between_tp_sizes_answers_as_colocated_tp1(
    servers: Servers,
    tp_cluster: dict[str, ServiceProc],
    colocated: Callable[[list[list[int]]], list[list[int]]],
    prefill_id: str,
    decode_id: str,
    seed: int,
) -> None:
    prefill, decode = tp_cluster[prefill_id], tp_cluster[decode_id]
    prompts = mixed_prompts(VOCAB, n=8, seed=seed)
    reference = colocated(prompts)
    got = await generate_all(
        decode.grpc, prompts, f"{prefill_id}-{decode_id}", prefill=prefill.target(), max_tokens=NEW
    )
    for i, (r, ref) in enumerate(zip(got, reference, strict=True)):
        where = f"prompt {i} ({len(prompts[i])} tokens), {prefill_id} -> {decode_id}"
        assert r.error is None, f"{where}: {r.error}"
        assert r.tokens == ref, f"{where}: differs from the colocated TP=1 engine"
        assert r.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert r.prefill_instance_id == prefill_id, f"{where}: the prompt KV came from {r.prefill_instance_id!r}"
    async with Loads(servers.nats.url, [CLUSTER]) as loads:
        await loads.all_pages_free([prefill_id, decode_id])


async def test_status_shows_each_instances_tp_size(servers: Servers, tp_cluster: dict[str, ServiceProc]) -> None:
    from shared.cluster.status import collect_status, format_table

    status = await collect_status(servers.etcd.url, servers.nats.url, CLUSTER, load_window_s=0.3)
    assert {r.instance_id: r.tp_size for r in status.rows} == {"p-tp1": 1, "p-tp2": 2, "d-tp1": 1, "d-tp2": 2}
    assert " TP " in format_table(status).splitlines()[1]
