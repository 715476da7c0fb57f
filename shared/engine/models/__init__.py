"""Model implementations. All supported architectures share the Llama-family decoder in llama.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from shared.engine.models.config import (
    SUPPORTED_ARCHITECTURES,
    ModelArchConfig,
    load_model_config,
    parse_model_config,
)
from shared.engine.models.llama import LlamaForCausalLM, WeightSlot
from shared.kernels.elementwise import TORCH_OPS, ElementwiseOps

if TYPE_CHECKING:
    from shared.engine.models.tp_hooks import TPComm

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
    tp: TPComm | None = None,
) -> LlamaForCausalLM:
    """An unloaded model for `cfg` (Llama, Qwen2 or Qwen3: the differences are flags on the config), calling the
    norm/rotary/activation kernels in `ops`, its parameters allocated on `device` (default: the CPU); `tp`: a
    tensor-parallel rank's collectives (cfg then sized per rank)."""
    assert cfg.architecture in SUPPORTED_ARCHITECTURES, cfg.architecture  # parse_model_config refused the rest
    return LlamaForCausalLM(cfg, dtype, max_positions, ops, device, tp)
