"""The runner an engine role builds from its config: one ModelRunner, or at --tp-size > 1 rank 0's TPRunner over
one process per rank (shared/engine/parallel). Nothing of the tensor-parallel path is imported at tp 1."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from shared.config.devices import local_gpu_index
from shared.engine.model_runner import DEFAULT_KV_BUDGET_BYTES, ModelRunner
from shared.engine.runner import Runner

if TYPE_CHECKING:
    from shared.config.groups import DeviceConfig


def rank_threads(threads: int | None, tp_size: int, device: str) -> int | None:
    """Threads of each rank: on cpu the ranks share the cores, so the configured threads (all cores when unset)
    are split among them; on cuda each rank keeps the configured number."""
    if tp_size == 1 or device != "cpu":
        return threads
    return max(1, (threads or torch.get_num_threads()) // tp_size)


def _follower_devices(device: str, cfg: DeviceConfig | None, tp_size: int) -> tuple[str, ...]:
    if device != "cuda":
        return (device,) * (tp_size - 1)
    # host GPU ids (base + r x step, as the config check counted them) in this process's numbering: the followers
    # inherit its CUDA_VISIBLE_DEVICES
    base, step = (cfg.base_gpu_id, cfg.gpu_id_step) if cfg is not None else (0, 1)
    return tuple(f"cuda:{local_gpu_index(base + r * step, os.environ)}" for r in range(1, tp_size))


def build_runner(
    path: Path,
    *,
    dtype: str,
    device: str,
    num_pages: int | None,
    kv_cache_dtype: str | None = None,
    quantization: str | None = None,
    kv_budget_bytes: int | None,
    page_size: int,
    attention_backend: str,
    linear_backend: str,
    max_batch_tokens: int,
    context_length: int | None,
    cuda_graph_bs: Sequence[int],
    tp_size: int = 1,
    threads: int | None = None,
    device_cfg: DeviceConfig | None = None,
) -> Runner:
    """ModelRunner(...) at tp 1; else rank 0 of tp_size ranks, `threads` being each rank's (rank_threads)."""
    if tp_size == 1:
        return ModelRunner(
            path,
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            quantization=quantization,
            device=device,
            num_pages=num_pages,
            kv_budget_bytes=kv_budget_bytes,
            page_size=page_size,
            attention_backend=attention_backend,
            linear_backend=linear_backend,
            max_batch_tokens=max_batch_tokens,
            context_length=context_length,
            cuda_graph_bs=cuda_graph_bs,
        )
    # the ranks' runners are built from TPOptions, which carries neither yet
    if quantization is not None:
        raise ValueError(f"--tp-size {tp_size}: --quantization runs at --tp-size 1 only for now")
    if kv_cache_dtype is not None and kv_cache_dtype != dtype:
        raise ValueError(f"--tp-size {tp_size}: --kv-cache-dtype {kv_cache_dtype} runs at --tp-size 1 only for now")
    from shared.engine.parallel.runner import TPOptions, start_tp_runner

    if device == "cpu" and num_pages is None:
        # the ranks share the host's memory: the instance's KV budget is split among them (each page of a rank's
        # pool holds 1/tp of the KV heads, so the pages, and the tokens they hold, are the same as at tp 1)
        kv_budget_bytes = (kv_budget_bytes or DEFAULT_KV_BUDGET_BYTES) // tp_size
    return start_tp_runner(
        TPOptions(
            tp_size=tp_size,
            model_dir=str(path),
            dtype=dtype,
            device=device,
            follower_devices=_follower_devices(device, device_cfg, tp_size),
            threads=threads or 1,
            num_pages=num_pages,
            kv_budget_bytes=kv_budget_bytes,
            page_size=page_size,
            attention_backend=attention_backend,
            linear_backend=linear_backend,
            max_batch_tokens=max_batch_tokens,
            context_length=context_length,
        )
    )
