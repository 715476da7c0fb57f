"""The GPU memory plan: weights from the safetensors headers + workspace + CUDA graphs + KV pool under
--mem-fraction-static x free memory, for Llama-3.1-8B and -70B (header-only checkpoints) on simulated GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import ConfigError, PassContext, StaticProbe, resolve
from shared.config.checkpoint import header_params, read_model_shape
from shared.config.memory_plan import gib
from shared.config.plan_passes import plan_for_config
from shared.config.probe import SimulatedProbe, probe_from_env
from tests.helpers.header_checkpoints import (
    LLAMA_31_8B,
    LLAMA_31_8B_PARAMS,
    LLAMA_31_70B,
    LLAMA_31_70B_PARAMS,
    write_header_checkpoint,
)

GIB = 1 << 30
ENGINES = frozenset({"nixl_cu12._api", "mooncake.engine"})


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_header_checkpoint(tmp_path_factory.mktemp("ckpt") / "Llama-3.1-8B-Instruct", LLAMA_31_8B)


@pytest.fixture(scope="module")
def llama70b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_header_checkpoint(tmp_path_factory.mktemp("ckpt") / "Llama-3.1-70B-Instruct", LLAMA_31_70B, 8)


def _gpus(n: int, memory: int, free: int | None = None) -> PassContext:
    probe = StaticProbe(cuda=True, gpus=n, memory_bytes=memory, free_bytes=free, modules=ENGINES)
    return PassContext(probe=probe)


def test_headers_give_the_parameter_count(llama8b: Path, llama70b: Path) -> None:
    assert read_model_shape(llama8b).num_params == LLAMA_31_8B_PARAMS
    shape = read_model_shape(llama70b)
    assert shape.num_params == LLAMA_31_70B_PARAMS and shape.num_layers == 80 and shape.head_dim == 128


def test_header_reader_agrees_with_safetensors(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.zeros(7), "c": torch.zeros(2, 2, 2)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert header_params(tmp_path / "model.safetensors") == sum(t.numel() for t in tensors.values())


def test_8b_fits_an_80_gib_gpu_and_the_kv_pool_is_what_is_left(llama8b: Path) -> None:
    cfg = resolve("decode", ["--model", str(llama8b)], env={}, ctx=_gpus(8, 80 * GIB))
    plan = plan_for_config(cfg, StaticProbe(cuda=True, gpus=8, memory_bytes=80 * GIB), str(llama8b))
    assert plan.problem() is None
    assert plan.weights == LLAMA_31_8B_PARAMS * 2  # bf16
    assert plan.page_bytes == 32 * 2 * 16 * 8 * 128 * 2
    assert plan.used <= plan.budget == int(0.9 * 80 * GIB)
    assert plan.budget - plan.used < plan.page_bytes  # every whole page that fits is in the pool
    assert plan.kv_tokens >= 131072  # one sequence of the full context
    assert 0 < plan.workspace < 2 * GIB and 0 < plan.graphs < GIB
    assert cfg.cache.kv_cache_memory_bytes == plan.kv  # the engine gets the plan's budget, not the whole fraction
    detail = cfg.provenance["cache.kv_cache_memory_bytes"].detail
    assert detail.startswith("memory plan on cuda:0: --mem-fraction-static 0.9 x 80.00 GiB free - weights 14.96 GiB")


def test_memory_held_by_other_processes_counts(llama8b: Path) -> None:
    full = resolve("decode", ["--model", str(llama8b)], env={}, ctx=_gpus(1, 80 * GIB))
    busy = resolve("decode", ["--model", str(llama8b)], env={}, ctx=_gpus(1, 80 * GIB, free=60 * GIB))
    assert full.cache.kv_cache_memory_bytes - busy.cache.kv_cache_memory_bytes == pytest.approx(18 * GIB, abs=1 << 22)


def test_70b_does_not_fit_one_80_gib_gpu(llama70b: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve("decode", ["--model", str(llama70b)], env={}, ctx=_gpus(8, 80 * GIB))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(
        "Llama-3.1-70B-Instruct does not fit on cuda:0: --mem-fraction-static 0.9 x 80.00 GiB free = 72.00 GiB, "
        "but weights 131.42 GiB"
    )
    assert "leave nothing for the KV pool; raise --tp-size" in msg


def test_70b_fits_four_80_gib_gpus_with_tp_4(llama70b: Path) -> None:
    cfg = resolve("decode", ["--model", str(llama70b), "--tp-size", "4"], env={}, ctx=_gpus(8, 80 * GIB))
    plan = plan_for_config(cfg, StaticProbe(cuda=True, gpus=8, memory_bytes=80 * GIB), str(llama70b))
    assert plan.problem() is None and plan.weights == LLAMA_31_70B_PARAMS * 2 // 4
    assert plan.page_bytes == 80 * 2 * 16 * 2 * 128 * 2  # 2 of the 8 KV heads per rank
    assert cfg.cache.kv_cache_memory_bytes == plan.kv


def test_too_much_fraction_on_a_16_gib_gpu_says_why(llama8b: Path) -> None:
    argv = ["--model", str(llama8b), "--mem-fraction-static", "0.99"]
    with pytest.raises(ConfigError) as info:
        resolve("worker", argv, env={}, ctx=_gpus(1, 16 * GIB))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(
        "Llama-3.1-8B-Instruct does not fit on cuda:0: --mem-fraction-static 0.99 x 16.00 GiB free = 15.84 GiB, but "
        "weights 14.96 GiB"
    )
    assert "to hold one 131072-token sequence; lower --context-length to" in msg
    short = resolve("worker", [*argv, "--context-length", "2048"], env={}, ctx=_gpus(1, 16 * GIB))
    assert short.cache.kv_cache_memory_bytes > 0


def test_a_user_sized_pool_is_checked_not_changed(llama8b: Path) -> None:
    ctx = _gpus(1, 80 * GIB)
    mine = resolve("decode", ["--model", str(llama8b), "--kv-cache-memory-bytes", "20GiB"], env={}, ctx=ctx)
    assert mine.cache.kv_cache_memory_bytes == 20 * GIB
    with pytest.raises(ConfigError, match=r"the KV pool of --num-pages .* lower --num-pages \(at most"):
        resolve("decode", ["--model", str(llama8b), "--num-pages", "500000"], env={}, ctx=ctx)


def test_the_plan_sees_the_process_gpu(llama8b: Path) -> None:
    cfg = resolve("decode", ["--model", str(llama8b), "--device", "cuda:5"], env={}, ctx=_gpus(8, 80 * GIB))
    assert cfg.device.device == "cuda" and cfg.device.base_gpu_id == 5
    assert "on cuda:5" in cfg.provenance["cache.kv_cache_memory_bytes"].detail


def test_bundled_model_not_on_disk_is_planned_at_engine_start() -> None:
    cfg = resolve("decode", env={}, ctx=_gpus(1, 80 * GIB))
    assert cfg.cache.kv_cache_memory_bytes == 0
    assert "memory plan at engine start" in cfg.provenance["cache.kv_cache_memory_bytes"].detail


def test_cpu_budget_is_unchanged(llama8b: Path) -> None:
    cpu = PassContext(probe=StaticProbe(memory_bytes=64 * GIB, modules=ENGINES))
    cfg = resolve("decode", ["--model", str(llama8b)], env={}, ctx=cpu)
    assert cfg.cache.kv_cache_memory_bytes == GIB and "capped" in cfg.provenance["cache.kv_cache_memory_bytes"].detail


def test_simulated_devices_from_the_environment(llama8b: Path) -> None:
    probe = probe_from_env({"PDRELAY_SIMULATE_DEVICES": "8x80GiB"})
    assert isinstance(probe, SimulatedProbe)
    assert probe.cuda_device_count() == 8 and probe.gpu_memory(7) == (80 * GIB, 80 * GIB)
    argv = ["--model", str(llama8b), "--context-length", "32768"]
    cfg = resolve("worker", argv, env={"PDRELAY_SIMULATE_DEVICES": "2 x 24GiB"})
    assert cfg.device.device == "cuda" and cfg.scheduler.chunked_prefill_size == 2048
    with pytest.raises(ConfigError, match=r"^PDRELAY_SIMULATE_DEVICES='eight' is not COUNTxMEMORY; write it as"):
        probe_from_env({"PDRELAY_SIMULATE_DEVICES": "eight"})


def test_gib_prints_two_decimals() -> None:
    assert gib(LLAMA_31_8B_PARAMS * 2) == "14.96 GiB"


def test_quantized_tensors_count_the_bytes_they_are_stored_in(tmp_path: Path) -> None:
    """fp8 weights at 1 byte and AWQ/GPTQ's packed int32s as stored; floating-point tensors in the served dtype."""
    import json

    import torch
    from safetensors.torch import save_file

    tensors = {
        "w": torch.zeros(256, 256, dtype=torch.float8_e4m3fn),
        "w_scale_inv": torch.zeros(2, 2),
        "qweight": torch.zeros(32, 64, dtype=torch.int32),
        "embed": torch.zeros(10, 10, dtype=torch.bfloat16),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"vocab_size": 10}))
    shape = read_model_shape(tmp_path)
    assert (shape.num_params, shape.stored_bytes) == (4 + 100, 256 * 256 + 32 * 64 * 4)
    assert shape.weights_bytes(2) == 2 * 104 + 65536 + 8192
