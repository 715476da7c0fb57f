"""config.json -> the few numbers our models need, with every unsupported feature refused by name.

Read from the raw JSON (not a transformers config object) so that both spellings of RoPE settings work:
transformers 5 writes `rope_parameters: {rope_theta, rope_type, ...}` (Gemma 3: one such dict per layer type),
older checkpoints `rope_theta` + `rope_scaling`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.config.quantization import parse_quantization
from shared.engine.models.mla_config import MLA_ARCHITECTURES, MLA_TYPES, MLAConfig, parse_mla_fields
from shared.kernels.rotary import SUPPORTED_ROPE_TYPES

# architectures[0] in config.json -> model_type. Llama, Qwen2/3, Mistral and Phi-3 share one decoder (llama.py);
# Gemma 2 and Gemma 3 (text) have their own layer (gemma.py); Qwen3-MoE, Mixtral and gpt-oss swap its MLP for routed
# experts (moe_model.py). DeepSeek-V2/V3 (latent attention, dense and MoE layers) have
# theirs (deepseek.py).
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "GptOssForCausalLM": "gpt_oss",
    **MLA_ARCHITECTURES,
}
GEMMA_TYPES = ("gemma2", "gemma3_text")
MOE_TYPES = ("qwen3_moe", "mixtral", "gpt_oss")
# hidden_act (Gemma: hidden_activation) each family's MLP may use
_ACTIVATIONS = {"gemma2": ("gelu_pytorch_tanh",), "gemma3_text": ("gelu_pytorch_tanh",)}
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class ModelArchConfig:
    """What our decoders need to know about a checkpoint."""

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
    qk_norm: bool  # Qwen3, Gemma 3: RMSNorm over head_dim of every q and k head before RoPE
    o_bias: bool = False  # Llama/Qwen3 with attention_bias (Qwen2 never has one)
    rope_scaling: Mapping[str, Any] | None = field(default=None, hash=False)
    eos_token_ids: tuple[int, ...] = ()
    # Sliding-window attention: layer i's query at position p sees keys at positions > p - layer_windows[i]
    # (transformers' rule); 0 = full attention. () = every layer full.
    layer_windows: tuple[int, ...] = ()
    rotary_dim: int = 0  # the leading dims of each head that RoPE rotates (Phi-3's partial_rotary_factor); 0 = all
    hidden_act: str = "silu"  # the gate's activation: silu, or gelu_pytorch_tanh (Gemma's GeGLU)
    attn_scale: float = 0.0  # the attention's softmax scale; 0 = head_dim ** -0.5 (Gemma: query_pre_attn_scalar)
    attn_softcap: float = 0.0  # Gemma 2: scores -> cap * tanh(scores / cap) before the mask; 0 = none
    final_softcap: float = 0.0  # Gemma 2: the same on the logits
    embed_scale: float = 1.0  # Gemma: the embeddings are multiplied by sqrt(hidden_size)
    # Gemma 3: sliding layers rotate with their own base (and no scaling); None = the same RoPE as full layers
    local_rope_theta: float | None = None
    # Mixture of experts (Qwen3-MoE, Mixtral): the MLP of the layers in moe_layers is num_experts experts of
    # moe_intermediate_size, experts_per_token of them per token (softmax router, top-k; norm_topk_prob: the top-k
    # weights renormalised to sum to 1). 0 experts: a dense model.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()
    # gpt-oss: router logits with a bias, top-k then softmax over the k; experts with biases and a clamped SwiGLU
    # (gate and up interleaved in the checkpoint): (clamp(up, +-limit) + 1) * g * sigmoid(alpha * g), g = min(gate,
    # limit). "" = the softmax-then-top-k router and silu(gate) * up experts of Qwen3-MoE and Mixtral.
    moe_kind: str = ""
    swiglu_alpha: float = 0.0
    swiglu_limit: float = 0.0
    attn_sinks: bool = False  # gpt-oss: a learned logit per query head joins every softmax (window_attention.py)
    # DeepSeek (moe_kind deepseek_v2 / deepseek_v3, mla_config.py): the experts come in expert_groups groups of which
    # topk_groups are kept per token before the top-k; the chosen weights times routed_scaling_factor; plus
    # shared_experts experts of moe_intermediate_size that every token passes through (one dense MLP)
    expert_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    shared_experts: int = 0

    def is_moe(self, layer: int) -> bool:
        """Layer `layer`'s MLP is the routed experts (else the dense MLP of intermediate_size)."""
        return layer in self.moe_layers

    # DeepSeek's multi-head latent attention (mla_config.py); then num_kv_heads is 1 and head_dim the latent row's
    # width: the KV cache holds one latent "head" per token (an "mla" KVLayout)
    mla: MLAConfig | None = None

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window in tokens, 0 for full attention."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def host_planned_attention(self) -> bool:
        """Some layer is windowed, soft-capped or has sinks: its attention is planned on the host
        (window_attention.py), which a CUDA graph cannot capture; so is MLA's attention over the latent cache
        (mla_attention.py)."""
        return any(self.layer_windows) or bool(self.attn_softcap) or self.attn_sinks or self.mla is not None

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _supported_line() -> str:
    return f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"


def _architecture(cfg: Mapping[str, Any], source: str) -> tuple[str, str]:
    """(architecture, model_type), or ValueError naming the field and listing what is supported."""
    if cfg.get("auto_map"):
        raise ValueError(
            f"{source}: auto_map is set: the model needs its own remote code, which is never run; {_supported_line()}"
        )
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        model_type = cfg.get("model_type")
        arch = next((a for a, t in SUPPORTED_ARCHITECTURES.items() if t == model_type), None)
    if arch is None:
        raise ValueError(
            f"{source}: architecture {archs or cfg.get('model_type')!r} is not supported; {_supported_line()}"
        )
    return arch, SUPPORTED_ARCHITECTURES[arch]


def _rope(params: Mapping[str, Any], cfg: Mapping[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling or None) from one rope_parameters dict, with the old top-level spellings as fallback."""
    rope = dict(params)
    scaling = cfg.get("rope_scaling") or None
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type") or rope.get("type")
    if scaling is None and rope_type not in (None, "default"):
        scaling = rope
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"{source}: rope_type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if kind == "default":
            scaling = None
    if scaling is not None and "original_max_position_embeddings" in cfg:  # Phi-3 keeps it at the top level
        scaling = {"original_max_position_embeddings": cfg["original_max_position_embeddings"], **scaling}
    if scaling is not None:
        kind = str(scaling.get("rope_type", scaling.get("type")))
        needs: tuple[str, ...] = ()
        if kind == "longrope":
            needs = ("short_factor", "long_factor", "original_max_position_embeddings")
        if kind == "yarn":  # (an unset factor is then max_position_embeddings / it, as transformers does)
            needs = ("original_max_position_embeddings",)
        missing = [k for k in needs if scaling.get(k) is None]
        if missing:
            raise ValueError(f"{source}: rope_type {kind!r} needs {', '.join(missing)} in its rope parameters")
    return theta, dict(scaling) if scaling else None


def _layer_windows(cfg: Mapping[str, Any], model_type: str, layers: int, source: str) -> tuple[int, ...]:
    """Per-layer sliding windows, as transformers decides them for each family."""
    window = int(cfg.get("sliding_window") or 0)
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
        window = 0  # Qwen keeps a sliding_window number in every config; it applies only with use_sliding_window
    if model_type == "llama" or window == 0:
        return ()
    types = cfg.get("layer_types")
    if model_type in ("mistral", "phi3", "mixtral", "qwen3_moe"):  # every layer slides (layer_types ignored)
        types = [SLIDING] * layers
    elif types is None and model_type in ("qwen2", "qwen3"):
        first = int(cfg.get("max_window_layers", layers))
        types = [SLIDING if i >= first else FULL for i in range(layers)]
    elif types is None:  # Gemma 2, gpt-oss alternate from layer 0; Gemma 3 has one full layer in every 6
        every = 2 if model_type in ("gemma2", "gpt_oss") else int(cfg.get("sliding_window_pattern", 6))
        types = [SLIDING if (i + 1) % every else FULL for i in range(layers)]
    if len(types) != layers or any(t not in (FULL, SLIDING) for t in types):
        raise ValueError(f"{source}: layer_types {types!r} must list {layers} of {FULL!r} / {SLIDING!r}")
    return tuple(window if t == SLIDING else 0 for t in types)


def _check_features(cfg: Mapping[str, Any], model_type: str, source: str) -> str:
    """Refuse what no decoder here implements; returns the MLP activation."""
    act_key = "hidden_activation" if model_type in GEMMA_TYPES and cfg.get("hidden_activation") else "hidden_act"
    act = cfg.get(act_key, "silu" if model_type not in GEMMA_TYPES else "gelu_pytorch_tanh")
    allowed = _ACTIVATIONS.get(model_type, ("silu",))
    if act not in allowed:
        raise ValueError(f"{source}: {act_key} {act!r} is not supported for {model_type} (only {', '.join(allowed)})")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{source}: mlp_bias=true is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError(f"{source}: use_bidirectional_attention=true is not supported (a causal LM only)")
    return str(act)


def _rotary_dim(cfg: Mapping[str, Any], head_dim: int, source: str) -> int:
    """The rotated dims of each head: head_dim, or Phi-3's partial_rotary_factor of it."""
    factor = float(
        (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    )
    dim = int(head_dim * factor)
    if dim <= 0 or dim % 2 or dim > head_dim:
        raise ValueError(f"{source}: partial_rotary_factor {factor} gives {dim} rotary dims of {head_dim}; need even")
    return 0 if dim == head_dim else dim


def _gemma_fields(cfg: Mapping[str, Any], model_type: str, hidden: int, source: str) -> dict[str, Any]:
    """Gemma's extras: the query scale, soft-capping, the embedding scale and Gemma 3's local RoPE base."""
    if model_type not in GEMMA_TYPES:
        return {}
    out: dict[str, Any] = {
        "attn_scale": float(cfg.get("query_pre_attn_scalar") or 256) ** -0.5,
        "attn_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
        "embed_scale": hidden**0.5,
    }
    if model_type == "gemma3_text":
        local = (cfg.get("rope_parameters") or {}).get(SLIDING)
        if local is not None:
            theta, scaling = _rope(local, {}, f"{source} rope_parameters.{SLIDING}")
            if scaling is not None:
                raise ValueError(f"{source}: rope scaling on sliding layers is not supported")
        else:
            theta = float(cfg.get("rope_local_base_freq", 10000.0))
        out["local_rope_theta"] = theta
    return out


def _moe_fields(cfg: Mapping[str, Any], model_type: str, layers: int, source: str) -> dict[str, Any]:
    """The routed experts of Qwen3-MoE and Mixtral, as transformers builds them; what neither family has (shared
    experts, another scoring function or top-k method) is refused by its field."""
    if model_type not in MOE_TYPES:
        return {}
    for key in ("n_shared_experts", "shared_expert_intermediate_size", "num_shared_experts"):
        if cfg.get(key):
            raise ValueError(f"{source}: {key}={cfg[key]!r}: shared experts are not supported for {model_type}")
    for key, default in (("scoring_func", "softmax"), ("topk_method", "greedy")):
        if cfg.get(key, default) != default:
            raise ValueError(f"{source}: {key} {cfg[key]!r} is not supported (only {default!r})")
    if cfg.get("quantization_config") or cfg.get("compression_config"):
        raise ValueError(f"{source}: quantization_config: quantized mixture-of-experts weights are not supported yet")
    # Qwen3-MoE's config.json says num_experts, transformers 5 writes num_local_experts (Mixtral's name) for both
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or 0)
    extra: dict[str, Any] = {}
    if model_type in ("mixtral", "gpt_oss"):  # every layer sparse, of intermediate_size; Mixtral renormalises
        sparse, inter, norm = tuple(range(layers)), int(cfg["intermediate_size"]), model_type == "mixtral"
        if model_type == "gpt_oss":
            alpha, limit = float(cfg.get("swiglu_alpha", 1.702)), float(cfg.get("swiglu_limit", 7.0))
            extra = {"moe_kind": "gpt_oss", "swiglu_alpha": alpha, "swiglu_limit": limit, "attn_sinks": True}
    else:
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense = {int(i) for i in cfg.get("mlp_only_layers") or ()}
        sparse = tuple(i for i in range(layers) if experts > 0 and i not in dense and (i + 1) % step == 0)
        inter, norm = int(cfg.get("moe_intermediate_size") or 0), bool(cfg.get("norm_topk_prob", False))
    if sparse and not (0 < top_k <= experts):
        raise ValueError(f"{source}: num_experts_per_tok {top_k} must be in 1..{experts} (the number of experts)")
    if sparse and inter <= 0:
        raise ValueError(f"{source}: moe_intermediate_size {inter} must be positive")
    if not sparse:
        return {}
    return {
        "num_experts": experts,
        "experts_per_token": top_k,
        "moe_intermediate_size": inter,
        "norm_topk_prob": norm,
        "moe_layers": sparse,
        **extra,
    }


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
    arch, model_type = _architecture(cfg, source)
    if model_type in MLA_TYPES:
        return _mla_config(cfg, arch, model_type, source)
    act = _check_features(cfg, model_type, source)
    rope = cfg.get("rope_parameters") or {}
    if model_type == "gemma3_text" and FULL in rope:
        rope = rope[FULL] or {}
    theta, scaling = _rope(rope, cfg, source)

    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ValueError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(cfg["num_hidden_layers"])
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelArchConfig(
        architecture=arch,
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type in GEMMA_TYPES)),
        qkv_bias=attention_bias or model_type == "qwen2",
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        o_bias=attention_bias and model_type != "qwen2",
        rope_scaling=scaling,
        eos_token_ids=_as_ids(cfg.get("eos_token_id")),
        layer_windows=_layer_windows(cfg, model_type, layers, source),
        rotary_dim=_rotary_dim(cfg, head_dim, source),
        hidden_act=act,
        **_gemma_fields(cfg, model_type, hidden, source),
        **_moe_fields(cfg, model_type, layers, source),
    )


def _mla_config(cfg: Mapping[str, Any], arch: str, model_type: str, source: str) -> ModelArchConfig:
    """DeepSeek-V2 / V3: the common numbers here, the attention's from mla_config.py."""
    return ModelArchConfig(
        architecture=arch,
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=False,
        eos_token_ids=_as_ids(cfg.get("eos_token_id")),
        **parse_mla_fields(cfg, model_type, source),
    )


def load_model_config(model_dir: str | Path) -> ModelArchConfig:
    """Read and parse <model_dir>/config.json."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json; point --model at a Hugging Face model directory")
    return parse_model_config(json.loads(path.read_text()), source=str(path))
