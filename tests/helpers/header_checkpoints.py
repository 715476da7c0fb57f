"""Checkpoints that are only headers: config.json, model.safetensors.index.json and shards holding a safetensors
header each and no data. The memory plan reads nothing else, so Llama-3.1-8B and -70B plan on a CPU box without a
byte of their weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}
LLAMA_31_70B: dict[str, Any] = {
    **LLAMA_31_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
LLAMA_31_8B_PARAMS = 8_030_261_248
LLAMA_31_70B_PARAMS = 70_553_706_496


def llama_tensors(cfg: dict[str, Any]) -> dict[str, list[int]]:
    """HF tensor name -> shape of a Llama checkpoint with this config."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    out: dict[str, list[int]] = {"model.embed_tokens.weight": [v, h]}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out |= {
            p + "input_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [h, h],
            p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h],
            p + "self_attn.o_proj.weight": [h, h],
            p + "post_attention_layernorm.weight": [h],
            p + "mlp.gate_proj.weight": [i, h],
            p + "mlp.up_proj.weight": [i, h],
            p + "mlp.down_proj.weight": [h, i],
        }
    out["model.norm.weight"] = [h]
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = [v, h]
    return out


def _write_header(path: Path, tensors: dict[str, list[int]], dtype: str = "BF16", elem: int = 2) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        n = elem
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)  # the data itself is left out


def write_header_checkpoint(out: Path, cfg: dict[str, Any], shards: int = 4) -> Path:
    """config.json + an index + `shards` header-only shard files of a Llama checkpoint; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    tensors = list(llama_tensors(cfg).items())
    per = -(-len(tensors) // shards)
    weight_map = {}
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = dict(tensors[k * per : (k + 1) * per])
        _write_header(out / name, part)
        weight_map |= {t: name for t in part}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out
