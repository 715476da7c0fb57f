"""config.json -> the few numbers our models need, with every unsupported feature refused by name.

Read from the raw JSON (not a transformers config object) so that both spellings of RoPE settings work:
transformers 5 writes `rope_parameters: {rope_theta, rope_type, ...}`, older checkpoints `rope_theta` +
`rope_scaling`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.config.quantization import parse_quantization
from shared.kernels.rotary import SUPPORTED_ROPE_TYPES

# architectures[0] in config.json -> model_type; all three share one decoder (see llama.py)
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class ModelArchConfig:
    """What our Llama-family decoder needs to know about a checkpoint."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 (and Llama/Qwen3 with attention_bias)
    qk_norm: bool  # Qwen3: RMSNorm over head_dim of every q and k head before RoPE
    o_bias: bool = False  # Llama/Qwen3 with attention_bias (Qwen2 never has one)
    rope_scaling: Mapping[str, Any] | None = field(default=None, hash=False)
    eos_token_ids: tuple[int, ...] = ()


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def parse_model_config(cfg: Mapping[str, Any], source: str = "config.json") -> ModelArchConfig:
    """Validate and translate a config.json dict. Raises ValueError naming what is unsupported.

    A LLaVA checkpoint (llava.py) yields its text decoder's config: its vision side is parsed by llava.py.
    """
    parse_quantization(cfg, source)  # refuses a quantization method the engine cannot run, by name (quantization.py)
    if cfg.get("model_type") == "llava" or "LlavaForConditionalGeneration" in (cfg.get("architectures") or ()):
        text = {k: v for k, v in (cfg.get("text_config") or {}).items() if k != "architectures"}
        text.setdefault("model_type", "llama")
        text["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
        if text.get("eos_token_id") is None and cfg.get("eos_token_id") is not None:
            text["eos_token_id"] = cfg["eos_token_id"]
        return parse_model_config(text, source=f"{source} (text_config)")
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        model_type = cfg.get("model_type")
        arch = next((a for a, t in SUPPORTED_ARCHITECTURES.items() if t == model_type), None)
    if arch is None:
        raise ValueError(
            f"{source}: architecture {archs or cfg.get('model_type')!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    model_type = SUPPORTED_ARCHITECTURES[arch]
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{source}: mlp_bias=true is not supported")
    if cfg.get("use_sliding_window"):
        raise ValueError(f"{source}: use_sliding_window=true is not supported; only full attention is")
    if float(cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor {cfg['partial_rotary_factor']} is not supported (only 1.0)")

    rope = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or None
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type") or rope.get("type")
    if scaling is None and rope_type not in (None, "default"):
        scaling = rope
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"{source}: rope scaling {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if kind == "default":
            scaling = None

    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ValueError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelArchConfig(
        architecture=arch,
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias or model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        o_bias=attention_bias and model_type != "qwen2",
        rope_scaling=dict(scaling) if scaling else None,
        eos_token_ids=_as_ids(cfg.get("eos_token_id")),
    )


def load_model_config(model_dir: str | Path) -> ModelArchConfig:
    """Read and parse <model_dir>/config.json."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json; point --model at a Hugging Face model directory")
    return parse_model_config(json.loads(path.read_text()), source=str(path))
