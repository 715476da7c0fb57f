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


def ct_config(strategy: str) -> dict:
    """quantization_config as llm-compressor writes it for its FP8_DYNAMIC (channel) and FP8 (tensor) schemes."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": strategy}
    weights |= {"dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax"}
    act = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "observer": None}
    act |= {"strategy": "token", "dynamic": True} if strategy == "channel" else {"strategy": "tensor", "dynamic": False}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": act, "output_activations": None}
    return {
        "config_groups": {"group_0": group},
        "format": "float-quantized",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
    }


def quantize_checkpoint_ct(src: Path, dst: Path, strategy: str) -> dict[str, torch.Tensor]:
    """Write a compressed-tensors FP8 copy of `src` into `dst`, each projection e4m3 with a `weight_scale` per
    output channel ([out, 1], bfloat16 as llm-compressor leaves a bf16 model's) or per tensor ([1] float32, o_proj's
    0-dim; a static `input_scale`; format naive-quantized); returns the dequantized weights (HF names)."""
    shutil.copytree(src, dst)
    state = load_file(src / "model.safetensors")
    out, dequant = {}, {}
    for name, w in state.items():
        if not (name.endswith(".weight") and name.split(".")[-2] in _PROJ):
            out[name] = w
            continue
        amax = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax().reshape(1)
        scale = (amax / 448.0).clamp(min=1e-12)
        scale = scale.bfloat16().float() if strategy == "channel" else scale
        w8 = (w / (scale if strategy == "channel" else scale[0])).clamp(-448, 448).to(torch.float8_e4m3fn)
        base = name.removesuffix("weight")
        out[name] = w8
        out[base + "weight_scale"] = scale.bfloat16() if strategy == "channel" else scale
        if strategy == "tensor" and name.endswith("o_proj.weight"):
            out[base + "weight_scale"] = scale.reshape(())  # older exports: a 0-dim per-tensor scale
        if strategy == "tensor":
            out[base + "input_scale"] = torch.tensor([0.02])
        dequant[name] = w8.float() * (scale if strategy == "channel" else scale[0])
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = ct_config(strategy)
    if strategy == "tensor":  # the other format llm-compressor writes fp8 in (the same e4m3 bytes)
        cfg["quantization_config"]["format"] = "naive-quantized"
    (dst / "config.json").write_text(json.dumps(cfg))
    return dequant
