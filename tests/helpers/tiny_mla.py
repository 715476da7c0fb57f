"""Tiny random-weight DeepSeek-V2 / V3 checkpoints (multi-head latent attention; dense, or with MoE layers), built with
transformers' own classes and saved offline, for the MLA parity tests (tests/shared/engine/test_mla_deepseek.py).

Variants:
  "v2":      DeepseekV2 with q LoRA (q_a_proj -> q_a_layernorm -> q_b_proj), plain RoPE;
  "v2-lite": DeepseekV2 without q LoRA (q_proj), as DeepSeek-V2-Lite ships;
  "v3":      DeepseekV3 with q LoRA, interleaved RoPE with yarn (mscale != mscale_all_dim, so both the attention
             factor on cos/sin and the softmax's mscale ** 2 bite);
  "v3-neox": DeepseekV3 with rope_interleave false and plain RoPE;
  "v2-moe":  "v2" with 3 layers, the last 2 MoE: 8 routed experts top-2 in 4 groups of which 1 is kept
             ("group_limited_greedy"), 1 shared expert, routed_scaling_factor 1.5;
  "v3-moe":  "v3" with 3 layers, the last 2 MoE: 8 experts top-2, "noaux_tc" over 4 groups keeping 2, 1 shared
             expert, norm_topk_prob, routed_scaling_factor 2.5 and a non-zero e_score_correction_bias (std 0.3:
             it changes which experts are chosen).
Every one: 3 heads (odd), qk_nope 8 + qk_rope 4 for q/k, v 12 (v != qk), kv_lora_rank 16; the dense variants have
first_k_dense_replace = num_hidden_layers (every layer dense; n_routed_experts set, as real configs have it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MLA_VARIANTS = ("v2", "v2-lite", "v3", "v3-neox", "v2-moe", "v3-moe")
MOE = dict(
    first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
    "beta_fast": 32,
    "beta_slow": 1,
}


def mla_config_kwargs(variant: str, *, layers: int = 2, vocab: int = 512, **overrides: Any) -> dict[str, Any]:
    """DeepseekV2Config / DeepseekV3Config keyword arguments of a variant."""
    if variant not in MLA_VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {MLA_VARIANTS}")
    moe = variant.endswith("-moe")
    layers = 3 if moe and layers == 2 else layers
    kw: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=72,
        intermediate_size=96,
        moe_intermediate_size=16,
        num_hidden_layers=layers,
        num_attention_heads=3,
        num_key_value_heads=3,
        q_lora_rank=None if variant == "v2-lite" else 24,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=12,
        first_k_dense_replace=layers,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters=YARN if variant in ("v3", "v3-moe") else {"rope_type": "default", "rope_theta": 10000.0},
    )
    if moe:
        kw.update(MOE)
        if variant == "v2-moe":
            # one group of 2 kept: with top-2, keeping 2 groups ranked by their best expert never changes the choice
            kw.update(topk_method="group_limited_greedy", topk_group=1, routed_scaling_factor=1.5)
        else:
            kw.update(topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=2.5)
    if variant == "v3-neox":
        kw["rope_interleave"] = False
    kw.update(overrides)
    return kw


def make_tiny_mla(tmp_dir: str | Path, variant: str = "v2", *, seed: int = 0, **overrides: Any) -> Path:
    """Write a random-weight checkpoint of `variant` (+ a trained tokenizer) into tmp_dir/<variant>-<seed>."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    from tests.helpers.tiny_models import CHATML_TEMPLATE, train_tokenizer

    out = Path(tmp_dir) / f"{variant}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(512)
    eos, bos = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    kw = mla_config_kwargs(variant, bos_token_id=bos, eos_token_id=eos, **overrides)
    if variant in ("v2", "v2-lite"):
        kw.pop("n_group"), kw.pop("topk_group")
    if variant.startswith("v2"):
        cfg, cls = transformers.DeepseekV2Config(**kw), transformers.DeepseekV2ForCausalLM
    else:
        cfg, cls = transformers.DeepseekV3Config(**kw), transformers.DeepseekV3ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # not all ones, so a wrong norm weight shows
            else:
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a buffer: selection only, so big enough to change it
                b.copy_(0.3 * torch.randn_like(b))
    model.save_pretrained(out, safe_serialization=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    return out
