"""A DeepSeek-V3-shaped checkpoint (MLA; a dense layer, then MoE layers with grouped noaux_tc routing and a shared
expert) served by real processes: a colocated worker, and a prefill and
a decode moving latent pages (the "mla" KV layout: one row of kv_lora_rank + qk_rope_head_dim per token and layer)
over NIXL. Both answer with the greedy tokens of an in-process engine over the same checkpoint (whose logits are
checked against transformers in tests/shared/engine/test_mla_deepseek.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_mla import make_tiny_mla
from tests.services.disagg.disagg_client import generate_all
from tests.services.disagg.disagg_procs import BackendCluster, Servers, Spec, start_services, stop_services

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NEW = 8
ARGS = ("--num-pages", "64", "--page-size", "16")


@pytest.fixture(scope="module")
def mla_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_mla(tmp_path_factory.mktemp("mla-served"), "v3-moe")


@pytest.fixture(scope="module")
def mla_cluster(servers: Servers, mla_model: Path) -> Iterator[BackendCluster]:
    specs = [
        Spec("worker", "w-mla", "mla-colo", ARGS),
        Spec("prefill", "p-mla", "mla-pd", (*ARGS, "--transfer-backend", "nixl")),
        Spec("decode", "d-mla", "mla-pd", (*ARGS, "--transfer-backend", "nixl")),
    ]
    procs = start_services(servers.tmp, servers.etcd, servers.nats, mla_model, specs)
    try:
        yield BackendCluster("mla", "mla-pd", procs, servers.nats.url, mla_model)
    finally:
        stop_services(procs.values())


async def test_mla_model_serves_colocated_and_disaggregated(mla_cluster: BackendCluster) -> None:
    prompts = [[5, 17, 99, 3], list(range(40, 61)), [250, 7, 7, 7, 300, 12] * 5]
    runner = ModelRunner(mla_cluster.model_dir, num_pages=64, page_size=16)
    assert runner.layout.kind == "mla"
    engine = Engine(runner, cache=CacheConfig(page_size=16), scheduler=SchedulerConfig(max_prefill_tokens=64))
    ref = [list(c.token_ids) for c in engine.generate(prompts, SamplingParams(max_tokens=NEW, temperature=0.0))]
    w, p, d = mla_cluster.procs["w-mla"], mla_cluster.procs["p-mla"], mla_cluster.procs["d-mla"]
    colo = await generate_all(w.grpc, prompts, "mla-colo", max_tokens=NEW)
    disagg = await generate_all(d.grpc, prompts, "mla-pd", prefill=p.target(), max_tokens=NEW)
    for i, (c, g) in enumerate(zip(colo, disagg, strict=True)):
        assert c.tokens == ref[i][: len(c.tokens)] and len(c.tokens) > 0, f"prompt {i}: colocated"
        assert g.tokens == c.tokens, f"prompt {i}: disaggregated differs from colocated"
        assert g.prefill_instance_id == p.instance_id  # its KV came over NIXL, as latent pages
