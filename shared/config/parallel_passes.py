"""Resolution passes of the parallel group: --tp-size against the devices and the model, --dp-size refused.

Tensor parallelism runs one process per rank (shared/engine/parallel): on cuda one GPU each, on cpu the ranks share
the host's cores (the engine splits --threads among them), so tp > 1 is allowed on cpu too.
"""

from __future__ import annotations

import json
import os
from typing import Any

from shared.config.context import PassContext
from shared.config.devices import DeviceKind, cuda_name, process_gpus
from shared.config.errors import ConfigError
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role
from shared.config.tp_rules import tp_layout_problem


def check_parallel_fits(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """--dp-size 1 (data-parallel replicas are not built: refused, never ignored); on cuda the process's GPUs
    (base_gpu_id + i x gpu_id_step for its tp_size x dp_size ranks) are visible."""
    tp, dp = (cfg.parallel.tp_size, cfg.parallel.dp_size) if cfg.has("parallel") else (1, 1)
    if dp > 1:
        raise cfg.origin("parallel.dp_size").fail(
            str(dp),
            "is not supported yet (an instance runs one engine)",
            "use --dp-size 1 and start more instances for more replicas",
        )
    if cfg.device.device != DeviceKind.CUDA:
        return cfg
    base, step = cfg.device.base_gpu_id, cfg.device.gpu_id_step
    ids = process_gpus(base, step, tp * dp)
    gpus = ctx.probe.cuda_device_count()
    if ids[-1] < gpus:
        return cfg
    if not cfg.has("parallel"):
        raise cfg.origin("device.base_gpu_id").fail(
            str(base), f"names cuda:{base} but {gpus} GPUs are visible", f"use a GPU below {gpus}"
        )
    if base == 0 and step == 1:
        raise ConfigError(
            f"--tp-size {tp} x --dp-size {dp} needs {tp * dp} GPUs but {gpus} are visible; lower --tp-size or --dp-size"
        )
    raise ConfigError(
        f"--tp-size {tp} x --dp-size {dp} from --base-gpu-id {base} with --gpu-id-step {step} needs "
        f"{', '.join(map(cuda_name, ids))} but {gpus} GPUs are visible (cuda:0..cuda:{gpus - 1}); lower "
        "--base-gpu-id, --gpu-id-step, --tp-size or --dp-size"
    )


def _text_config(model_dir: str) -> dict[str, Any]:
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    # a vision-language checkpoint shards its text decoder
    return dict(raw.get("text_config") or {}) if raw.get("model_type") == "llava" else raw


def check_tp_layout(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """--tp-size shards the model: it divides the attention heads and the MLP, and splits or replicates the KV heads
    (shared/config/tp_rules.py). Checked from config.json when the model is on disk; the engine checks the same rule
    again when it shards the weights (a bundled model not prepared yet)."""
    if not cfg.has("parallel") or cfg.parallel.tp_size == 1 or cfg.role not in (Role.PREFILL, Role.DECODE, Role.WORKER):
        return cfg
    model_dir = ctx.locate_model(cfg.model.model, cfg.model.model_cache_dir)
    if model_dir is None:
        return cfg
    try:
        c = _text_config(model_dir)
        heads = int(c["num_attention_heads"])
        kv = int(c.get("num_key_value_heads") or heads)
        inter = int(c["intermediate_size"])
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"--model {cfg.model.model}: cannot read its config.json to check --tp-size ({e})") from None
    if c.get("kv_lora_rank"):  # DeepSeek's latent attention: its heads are not sliced per rank yet
        arch = (c.get("architectures") or [c.get("model_type")])[0]
        raise ConfigError(
            f"--tp-size {cfg.parallel.tp_size}: {arch} (multi-head latent attention, kv_lora_rank) runs at "
            f"--tp-size 1 only for now (--model {cfg.model.model})"
        )
    problem = tp_layout_problem(heads, kv, inter, cfg.parallel.tp_size)
    if problem is not None:
        raise ConfigError(f"{problem} (--model {cfg.model.model})")
    return cfg
