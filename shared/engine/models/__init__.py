"""Model implementations: the Llama-family decoder (llama.py), Gemma's subclass of it (gemma.py), the
mixture-of-experts one (moe_model.py) and DeepSeek's MLA decoder (deepseek.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from shared.config.quantization import QuantSpec
from shared.engine.models.config import (
    GEMMA_TYPES,
    SUPPORTED_ARCHITECTURES,
    ModelArchConfig,
    load_model_config,
    parse_model_config,
)
from shared.engine.models.deepseek import DeepseekForCausalLM
from shared.engine.models.gemma import GemmaForCausalLM
from shared.engine.models.llama import LlamaForCausalLM, WeightSlot
from shared.engine.models.moe_model import MoeForCausalLM
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
    quant: QuantSpec | None = None,
    tp: TPComm | None = None,
) -> LlamaForCausalLM:
    """An unloaded model for `cfg` (Gemma's, the MoE families' and DeepSeek's own classes; the other families' differences are
    flags on the config), calling the norm/rotary/activation kernels in `ops`, its parameters allocated on `device`
    (default: the CPU);
    `quant`: its projections' weights fp8 or int4 blocks (shared.config.quantization); `tp`: a tensor-parallel
    rank's collectives (cfg then sized per rank)."""
    assert cfg.architecture in SUPPORTED_ARCHITECTURES, cfg.architecture  # parse_model_config refused the rest
    cls: type[LlamaForCausalLM] = LlamaForCausalLM
    if cfg.model_type in GEMMA_TYPES:
        cls = GemmaForCausalLM
    elif cfg.mla is not None:
        cls = DeepseekForCausalLM
    elif cfg.num_experts:
        cls = MoeForCausalLM
    return cls(cfg, dtype, max_positions, ops, device, quant, tp)
