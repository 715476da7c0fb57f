"""An engine process on a GPU, at start and before any weight is loaded: open its own GPU (the host's
--base-gpu-id, renumbered by CUDA_VISIBLE_DEVICES), then plan its memory again against what is free on that GPU now
(another process on it counts). A plan that does not fit fails the start with the plan's one-line reason; one that
fits gives the engine its KV budget (the smaller of this plan's and the one `pdrelay up` made, which also leaves
room for an encoder sharing the GPU)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from shared.config import ConfigError, ResolvedConfig
from shared.config.choices import EngineKind
from shared.config.devices import local_gpu_index
from shared.config.plan_passes import plan_for_config, user_kv_bytes
from shared.config.probe import HostProbe

log = logging.getLogger(__name__)
_KV_KEY = "cache.kv_cache_memory_bytes"


def start_on_device(
    cfg: ResolvedConfig, env: Mapping[str, str] | None = None, probe: HostProbe | None = None
) -> ResolvedConfig:
    """The config the engine is built from: unchanged on cpu; on cuda the current device is set and the KV budget
    is this process's plan. Raises ConfigError when the plan does not fit."""
    if cfg.device.device != "cuda":
        return cfg
    import torch

    torch.cuda.set_device(local_gpu_index(cfg.device.base_gpu_id, os.environ if env is None else env))
    if cfg.engine.engine != EngineKind.REAL:
        return cfg
    from shared.modelspec.bundled import resolve_model_path

    model_dir = resolve_model_path(cfg.model.model, cfg.model.model_cache_dir)
    plan = plan_for_config(cfg, probe or HostProbe(), str(model_dir))
    problem = plan.problem()
    if problem is not None:
        raise ConfigError(problem)
    log.info("%s", plan.summary())
    if cfg.cache.num_pages or user_kv_bytes(cfg):
        return cfg
    earlier = cfg.cache.kv_cache_memory_bytes
    if earlier and earlier <= plan.kv:
        return cfg  # the plan made before the start left room for a process sharing this GPU
    return cfg.derive(_KV_KEY, plan.kv, plan.summary() + " (at engine start)")
