"""DeepSeek-V2 / V3 config.json -> the fields of ModelArchConfig, for their multi-head latent attention (MLA).

Only checkpoints whose layers are all dense are loaded here: a config with MoE layers
(first_k_dense_replace < num_hidden_layers, transformers' rule for which layers are MoE) is refused by name.

Numbers follow transformers 5.x exactly:
  - the query: q_proj (V2-Lite), or q_a_proj -> q_a_layernorm -> q_b_proj (q_lora_rank); per head
    qk_nope_head_dim + qk_rope_head_dim;
  - kv_a_proj_with_mqa -> [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)], c_kv RMS-normed (kv_a_layernorm);
    kv_b_proj(c_kv) -> per head [k_nope | v];
  - the two latent norms have eps 1e-6 whatever rms_norm_eps says (transformers builds them with the default);
  - RoPE over qk_rope_head_dim with interleaved pairs (x0, x1), (x2, x3), ... (V2 always; V3 unless
    rope_interleave is false, then NeoX halves); default or yarn frequencies, yarn's attention_factor on cos/sin;
  - softmax scale (qk_nope + qk_rope) ** -0.5, times yarn's mscale(factor, mscale_all_dim) ** 2 when that is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.kernels.rope_scaling import yarn_mscale

MLA_ARCHITECTURES = {"DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3"}
MLA_TYPES = tuple(MLA_ARCHITECTURES.values())
MLA_ROPE_TYPES = ("default", "yarn")
LATENT_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: transformers' DeepseekV*RMSNorm default


@dataclass(frozen=True)
class MLAConfig:
    """The attention shape of a DeepSeek checkpoint; the KV cache holds latent_dim numbers per token and layer."""

    q_lora_rank: int  # 0: q_proj straight from the hidden state (V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # RoPE pairs (x0, x1), (x2, x3), ...; False: NeoX halves
    # yarn's parameters (rope_parameters / rope_scaling), None for plain RoPE
    yarn: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def latent_dim(self) -> int:
        """One cached row: the normed compressed KV followed by the roped shared key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def _rope(cfg: Mapping[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, yarn parameters or None); any other rope type refused naming the field."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    where = "rope_parameters"
    if cfg.get("rope_scaling"):  # the older spelling: rope_theta at the top level, rope_scaling beside it
        params, where = dict(cfg["rope_scaling"]), "rope_scaling"
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in MLA_ROPE_TYPES:
        raise ValueError(
            f"{source}: {where}.rope_type {kind!r} is not supported for DeepSeek (MLA) models; "
            f"supported: {', '.join(MLA_ROPE_TYPES)}"
        )
    if kind == "default":
        return theta, None
    if "original_max_position_embeddings" not in params:
        raise ValueError(f"{source}: {where} of rope_type 'yarn' needs original_max_position_embeddings")
    return theta, params


def _refuse_moe(cfg: Mapping[str, Any], layers: int, source: str) -> None:
    dense = cfg.get("first_k_dense_replace")
    dense = 0 if dense is None else int(dense)  # transformers' DeepseekV2Config default; V3 writes its own value
    if dense < layers:
        raise ValueError(
            f"{source}: first_k_dense_replace {dense} < num_hidden_layers {layers}: layers {dense}..{layers - 1} "
            f"are MoE layers (n_routed_experts {cfg.get('n_routed_experts')}); MoE layers of the DeepSeek family are "
            "not loaded yet (checkpoints whose layers are all dense, first_k_dense_replace >= num_hidden_layers, are)"
        )


def parse_mla_fields(cfg: Mapping[str, Any], model_type: str, source: str) -> dict[str, Any]:
    """ModelArchConfig's keyword arguments for a DeepSeek-V2 / V3 config.json, or ValueError naming the field."""
    layers = int(cfg["num_hidden_layers"])
    _refuse_moe(cfg, layers, source)
    if cfg.get("quantization_config"):
        raise ValueError(f"{source}: quantization_config: quantized DeepSeek (MLA) checkpoints are not loaded yet")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{source}: hidden_act {act!r} is not supported for {model_type} (only silu)")
    if cfg.get("attention_bias"):
        raise ValueError(f"{source}: attention_bias=true is not supported for DeepSeek (MLA) models yet")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{source}: mlp_bias=true is not supported")
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if kv_heads != heads:  # every head has its own k_nope / v from kv_b_proj; transformers assumes the same
        raise ValueError(f"{source}: num_key_value_heads {kv_heads} must equal num_attention_heads {heads} for MLA")
    theta, yarn = _rope(cfg, source)
    mla = MLAConfig(
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        rope_interleave=model_type == "deepseek_v2" or bool(cfg.get("rope_interleave", True)),
        yarn=yarn,
    )
    if mla.qk_rope_head_dim % 2:
        raise ValueError(f"{source}: qk_rope_head_dim {mla.qk_rope_head_dim} must be even for RoPE")
    scale = mla.qk_head_dim**-0.5
    if yarn is not None and yarn.get("mscale_all_dim"):
        m = yarn_mscale(float(yarn["factor"]), float(yarn["mscale_all_dim"]))
        scale = scale * m * m
    return {
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": 1,  # the cache holds one latent "head" per token
        "head_dim": mla.latent_dim,
        "rope_theta": theta,
        "attn_scale": scale,
        "qkv_bias": False,
        "o_bias": False,
        "hidden_act": act,
        "mla": mla,
    }
