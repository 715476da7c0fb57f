"""FP8 checkpoints (block-wise, and compressed-tensors per channel) served with an fp8 KV cache by real processes: a
colocated worker, and a prefill and a decode moving fp8 pages over NIXL. Both answer with the tokens of an in-process engine over the same checkpoint and
KV dtype (the weights' tolerance against transformers is tests/shared/engine/test_fp8_weights.py's, the KV dtype's
tests/shared/engine/test_fp8_kv.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams
from tests.helpers.quantized_models import quantize_checkpoint, quantize_checkpoint_ct
from tests.helpers.tiny_models import make_tiny_model
from tests.services.disagg.disagg_client import generate_all
from tests.services.disagg.disagg_procs import BackendCluster, Servers, Spec, start_services, stop_services

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NEW = 8
ARGS = ("--num-pages", "64", "--page-size", "16", "--kv-cache-dtype", "fp8_e4m3")


@pytest.fixture(scope="module", params=["block", "ct"])
def fp8_model(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp(f"fp8-{request.param}-served")
    src = make_tiny_model(tmp, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    if request.param == "block":
        quantize_checkpoint(src, tmp / "llama-fp8")
    else:
        quantize_checkpoint_ct(src, tmp / "llama-fp8", "channel")
    return tmp / "llama-fp8"


@pytest.fixture(scope="module")
def fp8_cluster(servers: Servers, fp8_model: Path) -> Iterator[BackendCluster]:
    tag = fp8_model.parent.name  # distinct instance and model names per checkpoint: one cluster after the other
    specs = [
        Spec("worker", f"w-{tag}", "fp8-colo", ARGS),
        Spec("prefill", f"p-{tag}", "fp8-pd", (*ARGS, "--transfer-backend", "nixl")),
        Spec("decode", f"d-{tag}", "fp8-pd", (*ARGS, "--transfer-backend", "nixl")),
    ]
    procs = start_services(servers.tmp, servers.etcd, servers.nats, fp8_model, specs)
    try:
        yield BackendCluster("fp8", "fp8-pd", procs, servers.nats.url, fp8_model)
    finally:
        stop_services(procs.values())


async def test_fp8_checkpoint_with_fp8_kv_serves_colocated_and_disaggregated(fp8_cluster: BackendCluster) -> None:
    prompts = [[5, 17, 99, 3], list(range(40, 61)), [250, 7, 7, 7, 300, 12] * 5]
    runner = ModelRunner(fp8_cluster.model_dir, kv_cache_dtype="fp8_e4m3", num_pages=64, page_size=16)
    engine = Engine(runner, cache=CacheConfig(page_size=16), scheduler=SchedulerConfig(max_prefill_tokens=64))
    ref = [list(c.token_ids) for c in engine.generate(prompts, SamplingParams(max_tokens=NEW, temperature=0.0))]
    tag = fp8_cluster.model_dir.parent.name
    w, p, d = fp8_cluster.procs[f"w-{tag}"], fp8_cluster.procs[f"p-{tag}"], fp8_cluster.procs[f"d-{tag}"]
    colo = await generate_all(w.grpc, prompts, "fp8-colo", max_tokens=NEW)
    disagg = await generate_all(d.grpc, prompts, "fp8-pd", prefill=p.target(), max_tokens=NEW)
    for i, (c, g) in enumerate(zip(colo, disagg, strict=True)):
        assert c.tokens == ref[i][: len(c.tokens)], f"prompt {i}: colocated"
        assert g.tokens == c.tokens, f"prompt {i}: disaggregated differs from colocated"
        assert g.prefill_instance_id == p.instance_id  # its KV came over NIXL, as fp8 pages
