"""Resolution passes for quantized weights (--quantization) and an fp8 KV cache (--kv-cache-dtype fp8_e4m3).

Both refuse at start, in one line, what the engine cannot run: a checkpoint quantized with a method it does not
support (named with what is supported), a --quantization the checkpoint does not carry, and KV pages of another
dtype than the model's (fp8) under an attention kernel that reads only pages of the model's dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

from shared.config.choices import AttentionBackend, EngineKind
from shared.config.context import PassContext
from shared.config.errors import ConfigError
from shared.config.quantization import check_requested, parse_quantization
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role

_ENGINE_ROLES = (Role.PREFILL, Role.DECODE, Role.WORKER)


def check_quantization(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """An engine role's checkpoint (when it is on disk) declares a quantization the engine runs, and the same one
    --quantization names if given. A model not prepared yet is checked by the engine when it loads it."""
    if not cfg.has("model") or cfg.role not in _ENGINE_ROLES or cfg.engine.engine is not EngineKind.REAL:
        return cfg
    model_dir = ctx.locate_model(cfg.model.model, cfg.model.model_cache_dir)
    config = Path(model_dir) / "config.json" if model_dir is not None else None
    if config is None or not config.is_file():
        return cfg
    try:
        spec = parse_quantization(json.loads(config.read_text()), source=f"--model {cfg.model.model}")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    problem = check_requested(cfg.model.quantization, spec, cfg.model.model)
    if problem is not None:
        raise ConfigError(problem)
    return cfg


def resolve_kv_attention(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """With KV pages of another dtype than the model's (fp8_e4m3, or bfloat16 under a float32 model) the attention
    backend is torch: its reference ops widen the pages they gather to the query's dtype; the native (CPU) and
    Triton kernels, and the native fused decode, read pages of the model's dtype. Runs before the auto -> triton
    choice on cuda."""
    if not cfg.has("cache") or not cfg.has("kernels") or str(cfg.cache.kv_cache_dtype) == str(cfg.model.dtype):
        return cfg
    kv, backend = cfg.cache.kv_cache_dtype, cfg.kernels.attention_backend
    if backend is AttentionBackend.AUTO:
        return cfg.derive(
            "kernels.attention_backend", AttentionBackend.TORCH, f"auto: torch, the kernels that read {kv} KV pages"
        )
    if backend is not AttentionBackend.TORCH:
        raise cfg.origin("kernels.attention_backend").fail(
            backend,
            f"reads KV pages of the model's dtype ({cfg.model.dtype}), not {kv}",
            "use --attention-backend torch (or auto)",
        )
    return cfg
