"""DeepSeek-V2 / V3 config.json -> ModelArchConfig (mla_config.py): what is read, and what is refused by name (MoE
layers, rope types other than default / yarn, quantized checkpoints) before any weight is touched; the runner's
refusals (--attention-backend other than torch, fp8 latent pages, --quantization, --tp-size > 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.engine.model_check import check_model_dir
from shared.engine.model_runner import ModelRunner, _check_shardable
from shared.engine.models.config import parse_model_config
from tests.helpers.tiny_mla import YARN, make_tiny_mla, mla_config_kwargs


def _json(variant: str, **overrides: Any) -> dict[str, Any]:
    arch = "DeepseekV2ForCausalLM" if variant.startswith("v2") else "DeepseekV3ForCausalLM"
    cfg = {**mla_config_kwargs(variant, **overrides), "architectures": [arch]}
    cfg["model_type"] = "deepseek_v2" if variant.startswith("v2") else "deepseek_v3"
    return cfg


def test_v3_yarn_fields_and_softmax_scale() -> None:
    a = parse_model_config(_json("v3"))
    assert a.architecture == "DeepseekV3ForCausalLM" and a.mla is not None
    m = a.mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (24, 16, 8, 4, 12)
    assert m.rope_interleave and m.yarn is not None and m.yarn["factor"] == 4.0
    assert (a.num_kv_heads, a.head_dim) == (1, 20)  # one latent "head" per token
    mscale = 0.1 * 0.8 * torch.log(torch.tensor(4.0)).item() + 1.0
    assert a.softmax_scale == pytest.approx(12**-0.5 * mscale * mscale)
    assert a.host_planned_attention  # no CUDA graphs for MLA's host-planned attention


def test_v2_lite_has_no_q_lora_and_v2_always_interleaves() -> None:
    a = parse_model_config(_json("v2-lite", rope_interleave=False))
    assert a.mla is not None and a.mla.q_lora_rank == 0 and a.mla.rope_interleave and a.mla.yarn is None
    assert a.softmax_scale == pytest.approx(12**-0.5)
    b = parse_model_config(_json("v3-neox"))
    assert b.mla is not None and not b.mla.rope_interleave


def test_moe_layers_are_parsed() -> None:
    a = parse_model_config(_json("v3-moe"))
    assert a.moe_layers == (1, 2) and a.moe_kind == "deepseek_v3" and a.num_experts == 8 and a.experts_per_token == 2
    assert (a.expert_groups, a.topk_groups, a.shared_experts, a.norm_topk_prob) == (4, 2, 1, True)
    assert a.routed_scaling_factor == 2.5 and a.moe_intermediate_size == 16
    cfg = _json("v2-moe")
    del cfg["first_k_dense_replace"], cfg["topk_method"]  # V2's defaults: every layer MoE, greedy (one group)
    b = parse_model_config(cfg)
    assert b.moe_layers == (0, 1, 2) and b.moe_kind == "deepseek_v2" and (b.expert_groups, b.topk_groups) == (1, 1)
    assert b.routed_scaling_factor == 1.5 and not b.norm_topk_prob
    assert not parse_model_config(_json("v3")).moe_layers  # first_k_dense_replace = num_hidden_layers: all dense


@pytest.mark.parametrize(
    ("variant", "overrides", "field"),
    [
        ("v2-moe", {"topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
        ("v3-moe", {"topk_method": "greedy"}, "topk_method 'greedy'"),
        ("v3-moe", {"scoring_func": "softmax"}, "scoring_func 'softmax'"),
        ("v2-moe", {"scoring_func": "sigmoid"}, "scoring_func 'sigmoid'"),
        ("v2-moe", {"norm_topk_prob": True}, "norm_topk_prob"),
        ("v3-moe", {"moe_layer_freq": 2}, "moe_layer_freq 2"),
        ("v3-moe", {"n_group": 3}, "n_group 3"),
        ("v3-moe", {"topk_group": 5}, "topk_group 5"),
        ("v3-moe", {"n_group": 8, "topk_group": 2}, "at least 2 experts per group"),
        ("v3-moe", {"num_experts_per_tok": 9}, "num_experts_per_tok 9"),
        ("v2-moe", {"num_experts_per_tok": 3}, "num_experts_per_tok 3 > the experts of topk_group 1"),
        ("v3-moe", {"moe_intermediate_size": 0}, "moe_intermediate_size 0"),
        ("v2-moe", {"n_shared_experts": 0}, "n_shared_experts 0"),
    ],
)
def test_unsupported_moe_variants_are_refused(variant: str, overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_model_config(_json(variant, **overrides))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "rope_parameters.rope_type"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.rope_type"),
        ({"rope_parameters": {k: v for k, v in YARN.items() if k != "original_max_position_embeddings"}}, "original"),
        ({"num_key_value_heads": 1}, "num_key_value_heads"),
        ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, "quantization_config"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_unsupported_variants_are_refused(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_model_config(_json("v3", **overrides))


def test_runner_refusals(tmp_path: Path) -> None:
    d = make_tiny_mla(tmp_path, "v2")
    with pytest.raises(ValueError, match="--attention-backend native: DeepseekV2ForCausalLM .* torch ops only"):
        ModelRunner(d, num_pages=4, page_size=4, attention_backend="native")
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8_e4m3"):
        ModelRunner(d, num_pages=4, page_size=4, kv_cache_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match="--quantization fp8"):
        ModelRunner(d, num_pages=4, page_size=4, quantization="fp8")
    arch = ModelRunner(d, num_pages=4, page_size=4).arch
    with pytest.raises(ValueError, match="--tp-size 2: DeepseekV2ForCausalLM runs at --tp-size 1 only"):
        _check_shardable(2, d, torch.device("cpu"), (), arch, False)


def test_model_check_describes_and_refuses(tmp_path: Path) -> None:
    ok = check_model_dir(make_tiny_mla(tmp_path, "v3"))
    assert ok.ok, ok.reason
    assert "MLA" in ok.reason and "kv_lora_rank 16" in ok.reason and "yarn" in ok.reason
    moe = check_model_dir(make_tiny_mla(tmp_path, "v3-moe"))
    assert moe.ok and "8 experts top-2 of size 16 + 1 shared (1 dense layer)" in moe.reason, moe.reason
    bad = tmp_path / "moe"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(_json("v3-moe", topk_method="greedy")))
    res = check_model_dir(bad)
    assert not res.ok and "topk_method 'greedy'" in res.reason


def test_memory_plan_counts_latent_pages(tmp_path: Path) -> None:
    """The memory plan's page bytes are the pool's: one latent row per token and layer, no V half."""
    from shared.config.checkpoint import read_model_shape
    from shared.config.memory_plan import PlanInputs, page_bytes

    d = make_tiny_mla(tmp_path, "v3")
    shape = read_model_shape(d)
    assert (shape.kv_planes, shape.num_kv_heads, shape.head_dim) == (1, 1, 20)
    inp = PlanInputs(shape, 4, 4, 16, 1, 64, 4, 0, 512, 0.5)
    assert page_bytes(inp) == ModelRunner(d, num_pages=2, page_size=16).layout.page_bytes == 2 * 16 * 20 * 4
