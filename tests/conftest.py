"""Test-wide settings: offline hub, one torch thread per test process, GPU tests skipped without CUDA."""

from __future__ import annotations

import os

# Set before transformers/torch are imported by any test module.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Served and engine tests compare with transformers in fp32 (the 1e-4 contract); on a CPU with avx512_bf16
# `--dtype auto` would pick bf16, whose own contract tests/shared/engine/test_model_parity_bf16.py checks. The config
# tests resolve with env={} and a described host, so they still see auto.
os.environ.setdefault("PDRELAY_DTYPE", "float32")

import pytest
import torch

# Several test processes and services share a 2-core box; two OpenMP threads on a busy box are 10x slower.
torch.set_num_threads(int(os.environ.get("PDRELAY_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def bundled_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """The prepared bundled model (prepared once into the user's cache; ~25 s the first time)."""
    from shared.modelspec.bundled import resolve_model_path

    return resolve_model_path("bundled:smollm2-135m-instruct")
