"""Quantized copies of tiny checkpoints, written here with safetensors: FP8 block-wise (e4m3 + weight_scale_inv per
128 x 128 block, the DeepSeek-V3 / Qwen3-FP8 layout)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from shared.kernels.fp8_weight import quantize_fp8_block

BLOCK = (128, 128)
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _expand(scale: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return scale.repeat_interleave(BLOCK[0], 0).repeat_interleave(BLOCK[1], 1)[: shape[0], : shape[1]]


def quantize_checkpoint(src: Path, dst: Path) -> dict[str, torch.Tensor]:
    """Write an FP8 block-wise copy of `src` into `dst`; returns the dequantized weights (HF names)."""
    shutil.copytree(src, dst)
    state = load_file(src / "model.safetensors")
    out, dequant = {}, {}
    for name, w in state.items():
        if name.endswith(".weight") and name.split(".")[-2] in _PROJ:
            w8, s = quantize_fp8_block(w, BLOCK)
            out[name], out[name.removesuffix("weight") + "weight_scale_inv"] = w8, s
            dequant[name] = w8.float() * _expand(s, w.shape)
        else:
            out[name] = w
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
    }
    (dst / "config.json").write_text(json.dumps(cfg))
    return dequant
