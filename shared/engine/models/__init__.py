"""Model implementations. All supported architectures share the Llama-family decoder in llama.py."""

from __future__ import annotations

import torch

from shared.config.quantization import QuantSpec
from shared.engine.models.config import (
    SUPPORTED_ARCHITECTURES,
    ModelArchConfig,
    load_model_config,
    parse_model_config,
)
from shared.engine.models.llama import LlamaForCausalLM, WeightSlot
from shared.kernels.elementwise import TORCH_OPS, ElementwiseOps

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "LlamaForCausalLM",
    "ModelArchConfig",
    "WeightSlot",
    "build_model",
    "load_model_config",
    "parse_model_config",
]


def build_model(
    cfg: ModelArchConfig,
    dtype: torch.dtype,
    max_positions: int | None = None,
    ops: ElementwiseOps = TORCH_OPS,
    device: torch.device | None = None,
    quant: QuantSpec | None = None,
) -> LlamaForCausalLM:
    """An unloaded model for `cfg` (Llama, Qwen2 or Qwen3: the differences are flags on the config), calling the
    norm/rotary/activation kernels in `ops`, its parameters allocated on `device` (default: the CPU); `quant`: its
    projections' weights fp8 blocks (shared.config.quantization)."""
    assert cfg.architecture in SUPPORTED_ARCHITECTURES, cfg.architecture  # parse_model_config refused the rest
    return LlamaForCausalLM(cfg, dtype, max_positions, ops, device, quant)
