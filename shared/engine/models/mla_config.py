"""DeepSeek-V2 / V3 config.json -> the fields of ModelArchConfig, for their multi-head latent attention (MLA).

Layers first_k_dense_replace.. are MoE layers (transformers' rule): n_routed_experts routed experts, num_experts_per_tok
per token, plus n_shared_experts shared ones (moe.DeepseekMoEBlock for the router). V2 scores with a softmax, top-k
"greedy" or "group_limited_greedy" (groups ranked by their best expert); V3 with a sigmoid, "noaux_tc" (the groups
ranked by the sum of their best two biased scores, the top k among the topk_group kept ones by the biased scores, the
weights from the unbiased ones). Both scale the weights by routed_scaling_factor.

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


# (scoring function, top-k methods) each version's router implements (transformers 5.x's DeepseekV2/V3TopkRouter)
ROUTERS = {"deepseek_v2": ("softmax", ("greedy", "group_limited_greedy")), "deepseek_v3": ("sigmoid", ("noaux_tc",))}


def _groups(cfg: Mapping[str, Any], experts: int, method: str, source: str) -> tuple[int, int]:
    """(n_group, topk_group); greedy is one group, all kept."""
    if method == "greedy":
        return 1, 1
    groups, kept = int(cfg.get("n_group") or 0), int(cfg.get("topk_group") or 0)
    if groups <= 0 or experts % groups:
        raise ValueError(f"{source}: n_group {groups} must divide n_routed_experts {experts} for {method}")
    if not 0 < kept <= groups:
        raise ValueError(f"{source}: topk_group {kept} must be in 1..n_group ({groups})")
    if method == "noaux_tc" and experts // groups < 2:  # a group's score is the sum of its best two experts
        raise ValueError(f"{source}: noaux_tc needs at least 2 experts per group (n_routed_experts / n_group)")
    return groups, kept


def _moe_fields(cfg: Mapping[str, Any], model_type: str, layers: int, source: str) -> dict[str, Any]:
    """The routed + shared experts of layers first_k_dense_replace.. (transformers' rule for both versions), or {}
    when every layer is dense; what neither version's router does is refused by its field."""
    dense = cfg.get("first_k_dense_replace")
    dense = 0 if dense is None else int(dense)  # transformers' DeepseekV2Config default; V3 writes its own value
    experts = int(cfg.get("n_routed_experts") or 0)
    if dense >= layers or experts == 0:
        return {}
    if int(cfg.get("moe_layer_freq") or 1) != 1:  # transformers makes every layer from first_k_dense_replace sparse
        raise ValueError(f"{source}: moe_layer_freq {cfg['moe_layer_freq']} is not supported (only 1)")
    scoring, methods = ROUTERS[model_type]
    if cfg.get("scoring_func", scoring) != scoring:
        raise ValueError(
            f"{source}: scoring_func {cfg['scoring_func']!r} is not supported for {model_type} ({scoring})"
        )
    method = cfg.get("topk_method") or methods[0]
    if method not in methods:
        raise ValueError(f"{source}: topk_method {method!r} is not supported for {model_type}; supported: {methods}")
    norm = bool(cfg.get("norm_topk_prob", model_type == "deepseek_v3"))
    if norm and model_type == "deepseek_v2":  # transformers ignores it, DeepSeek's own code renormalises: ambiguous
        raise ValueError(f"{source}: norm_topk_prob=true is not supported for deepseek_v2")
    top_k, inter = int(cfg.get("num_experts_per_tok") or 0), int(cfg.get("moe_intermediate_size") or 0)
    if not 0 < top_k <= experts:
        raise ValueError(f"{source}: num_experts_per_tok {top_k} must be in 1..n_routed_experts ({experts})")
    if inter <= 0:
        raise ValueError(f"{source}: moe_intermediate_size {inter} must be positive")
    shared = int(cfg.get("n_shared_experts") or 0)
    if shared <= 0:  # transformers builds the shared experts' MLP on every MoE layer (and fails without them)
        raise ValueError(
            f"{source}: n_shared_experts {shared}: DeepSeek MoE layers without shared experts are not supported"
        )
    groups, kept = _groups(cfg, experts, method, source)
    if top_k > kept * (experts // groups):
        raise ValueError(f"{source}: num_experts_per_tok {top_k} > the experts of topk_group {kept} groups")
    default_scale = 2.5 if model_type == "deepseek_v3" else 1.0  # transformers' config defaults
    return {
        "num_experts": experts,
        "experts_per_token": top_k,
        "moe_intermediate_size": inter,
        "norm_topk_prob": norm,
        "moe_layers": tuple(range(max(dense, 0), layers)),
        "moe_kind": model_type,
        "expert_groups": groups,
        "topk_groups": kept,
        "routed_scaling_factor": float(cfg.get("routed_scaling_factor", default_scale)),
        "shared_experts": shared,
    }


def parse_mla_fields(cfg: Mapping[str, Any], model_type: str, source: str) -> dict[str, Any]:
    """ModelArchConfig's keyword arguments for a DeepSeek-V2 / V3 config.json, or ValueError naming the field."""
    layers = int(cfg["num_hidden_layers"])
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
        **_moe_fields(cfg, model_type, layers, source),
    }
