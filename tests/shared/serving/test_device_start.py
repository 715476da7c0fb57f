"""An engine's start on a GPU: its own device is opened, and the memory plan is checked against the memory free on
it now, before any weight is loaded (simulated with a described probe and a header-only checkpoint)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import ConfigError, PassContext, StaticProbe, resolve
from shared.serving.device_start import start_on_device
from tests.helpers.header_checkpoints import LLAMA_31_8B, write_header_checkpoint

GIB = 1 << 30


@pytest.fixture
def gpu_cfg(tmp_path: Path):
    model = write_header_checkpoint(tmp_path / "Llama-3.1-8B", LLAMA_31_8B)
    probe = StaticProbe(cuda=True, gpus=8, memory_bytes=80 * GIB, modules=frozenset({"nixl_cu12._api"}))
    return resolve("decode", ["--model", str(model), "--base-gpu-id", "3"], env={}, ctx=PassContext(probe=probe))


def test_cpu_is_unchanged() -> None:
    cfg = resolve("worker", ["--device", "cpu"], env={})
    assert start_on_device(cfg) is cfg


def test_own_gpu_and_the_plan_with_what_is_free_now(gpu_cfg, monkeypatch) -> None:
    import torch

    opened: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", opened.append)
    busy = StaticProbe(cuda=True, gpus=8, memory_bytes=80 * GIB, free_bytes=70 * GIB)
    out = start_on_device(gpu_cfg, env={"CUDA_VISIBLE_DEVICES": "3"}, probe=busy)
    assert opened == [0]  # host GPU 3 is this process's cuda:0
    assert 0 < out.cache.kv_cache_memory_bytes < gpu_cfg.cache.kv_cache_memory_bytes
    assert out.provenance["cache.kv_cache_memory_bytes"].detail.endswith("(at engine start)")
    full = StaticProbe(cuda=True, gpus=8, memory_bytes=80 * GIB)
    assert start_on_device(gpu_cfg, env={}, probe=full) is gpu_cfg  # the earlier plan stands
    assert opened == [0, 3]


def test_a_plan_that_no_longer_fits_fails_the_start(gpu_cfg, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    crowded = StaticProbe(cuda=True, gpus=8, memory_bytes=80 * GIB, free_bytes=12 * GIB)
    with pytest.raises(ConfigError, match=r"does not fit on cuda:3: --mem-fraction-static 0.9 x 12.00 GiB free"):
        start_on_device(gpu_cfg, env={}, probe=crowded)
