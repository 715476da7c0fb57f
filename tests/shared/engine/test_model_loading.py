"""config.json parsing and the strict weight loader: refused architectures and features, missing / unexpected /
misshaped tensors, sharded checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shared.engine.models import SUPPORTED_ARCHITECTURES, build_model, load_model_config, parse_model_config
from shared.engine.weights import load_weights
from tests.helpers.tiny_models import tiny_llama_dir, tiny_qwen2_dir, tiny_qwen3_dir  # noqa: F401

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2}
QWEN3_MOE["moe_intermediate_size"] = 16


def test_unsupported_architecture_names_it_and_the_supported_list() -> None:
    cfg = dict(BASE, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ValueError) as e:
        parse_model_config(cfg)
    assert "GPT2LMHeadModel" in str(e.value)
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in str(e.value)


@pytest.mark.parametrize(
    "extra,match",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"rope_scaling": {"rope_type": "su", "factor": 4.0}}, "rope_type 'su'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "needs original_max_position_embeddings"),
        ({"auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}, "auto_map"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization 'bitsandbytes' is not supported"),
        ({"architectures": ["Phi3ForCausalLM"], "rope_scaling": {"type": "longrope"}}, "needs short_factor, long_f"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "rope_type 'yarn' needs original_max_position_embeddings"),
        ({"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.375}, "partial_rotary_factor"),
        ({"architectures": ["Gemma3ForCausalLM"], "use_bidirectional_attention": True}, "use_bidirectional"),
        ({"architectures": ["Gemma2ForCausalLM"], "hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
        (dict(QWEN3_MOE, shared_expert_intermediate_size=32), "shared_expert_intermediate_size=32: shared experts"),
        (dict(QWEN3_MOE, num_experts_per_tok=5), "num_experts_per_tok 5 must be in 1..4"),
        (dict(QWEN3_MOE, moe_intermediate_size=0), "moe_intermediate_size 0"),
        (
            {"architectures": ["GptOssForCausalLM"], "quantization_config": {"quant_method": "mxfp4"}},
            "quantization 'mxfp4' is not supported",
        ),
        ({"architectures": ["MixtralForCausalLM"], "scoring_func": "sigmoid"}, "scoring_func 'sigmoid'"),
        ({"architectures": ["MixtralForCausalLM"], "topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
        (
            {
                "architectures": ["MixtralForCausalLM"],
                "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
            },
            "quantization_config: quantized mixture-of-experts",
        ),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "use_sliding_window": True,
                "sliding_window": 4,
                "layer_types": ["x", "y"],
            },
            "layer_types",
        ),
    ],
)
def test_unsupported_features_are_refused(extra: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as e:
        parse_model_config(dict(BASE, **extra))
    assert "\n" not in str(e.value)  # one line at start


def test_sliding_windows_per_family() -> None:
    """Which layers slide, as transformers decides it: Mistral and Phi-3 all; Qwen only with use_sliding_window and
    from max_window_layers on; Gemma 2 every other layer from 0; Gemma 3 five in six; layer_types when given."""

    def windows(arch: str, **extra: object) -> tuple[int, ...]:
        cfg = {**BASE, "architectures": [arch], "num_hidden_layers": 6, "sliding_window": 7, **extra}
        cfg.pop("model_type")
        return parse_model_config(cfg).layer_windows

    assert windows("MistralForCausalLM") == (7,) * 6
    assert windows("MistralForCausalLM", sliding_window=None) == ()
    assert windows("Phi3ForCausalLM") == (7,) * 6
    assert windows("Qwen2ForCausalLM") == ()  # sliding_window alone does nothing
    assert windows("Qwen3ForCausalLM", use_sliding_window=True, max_window_layers=4) == (0, 0, 0, 0, 7, 7)
    assert windows("Gemma2ForCausalLM") == (7, 0, 7, 0, 7, 0)
    assert windows("Gemma3ForCausalLM") == (7, 7, 7, 7, 7, 0)
    assert windows("Gemma3ForCausalLM", layer_types=["full_attention"] * 5 + ["sliding_attention"]) == (0,) * 5 + (7,)
    moe = {"num_local_experts": 4, "num_experts_per_tok": 2}
    assert windows("MixtralForCausalLM", **moe) == (7,) * 6
    assert windows("GptOssForCausalLM", **moe) == (7, 0, 7, 0, 7, 0)
    assert windows("GptOssForCausalLM", **moe, layer_types=["full_attention"] * 6) == (0,) * 6
    assert windows("LlamaForCausalLM") == ()


def test_both_rope_spellings() -> None:
    old = parse_model_config(
        dict(
            BASE,
            rope_theta=5e5,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        )
    )
    new = parse_model_config(
        dict(
            BASE,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 5e5,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        )
    )
    assert old.rope_theta == new.rope_theta == 5e5
    assert old.rope_scaling is not None and new.rope_scaling is not None
    assert old.rope_scaling["factor"] == new.rope_scaling["factor"] == 8.0
    plain = parse_model_config(dict(BASE, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))
    assert plain.rope_scaling is None and plain.head_dim == 8


def test_family_flags(tiny_qwen2_dir: Path, tiny_qwen3_dir: Path) -> None:
    q2, q3 = load_model_config(tiny_qwen2_dir), load_model_config(tiny_qwen3_dir)
    assert q2.qkv_bias and not q2.qk_norm and not q2.o_bias
    assert q3.qk_norm and not q3.qkv_bias and q3.head_dim == 32  # head_dim decoupled from hidden / heads
    assert not parse_model_config(BASE).qkv_bias


def test_moe_layers_per_family() -> None:
    """Which layers are sparse, as transformers builds them: Mixtral all (its intermediate_size is the experts'),
    Qwen3-MoE every decoder_sparse_step-th but mlp_only_layers, none without experts; both spellings of the expert
    count (config.json's num_experts, transformers 5's num_local_experts)."""
    six = dict(BASE, num_hidden_layers=6)
    mix = parse_model_config(
        dict(six, architectures=["MixtralForCausalLM"], num_local_experts=8, num_experts_per_tok=2)
    )
    assert mix.moe_layers == tuple(range(6)) and mix.moe_intermediate_size == 64 and mix.norm_topk_prob
    assert mix.num_experts == 8 and mix.experts_per_token == 2 and mix.is_moe(5)
    q = dict(six, **QWEN3_MOE)
    assert parse_model_config(q).moe_layers == tuple(range(6)) and not parse_model_config(q).norm_topk_prob
    assert parse_model_config(dict(q, decoder_sparse_step=2)).moe_layers == (1, 3, 5)
    assert parse_model_config(dict(q, mlp_only_layers=[0, 4], norm_topk_prob=True)).moe_layers == (1, 2, 3, 5)
    local = {k: v for k, v in q.items() if k != "num_experts"}
    assert parse_model_config(dict(local, num_local_experts=4)).num_experts == 4
    dense = parse_model_config(dict(q, num_experts=0))
    assert dense.moe_layers == () and dense.num_experts == 0 and not dense.is_moe(0)
    assert parse_model_config(dict(q, use_sliding_window=True, sliding_window=5)).layer_windows == (5,) * 6
    assert parse_model_config(dict(q, sliding_window=5)).layer_windows == ()


def _copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _load(model_dir: Path) -> torch.nn.Module:
    cfg = load_model_config(model_dir)
    model = build_model(cfg, torch.float32)
    load_weights(model, model.hf_weight_map(), model_dir, tied_lm_head=cfg.tie_word_embeddings)
    return model


def test_loads_every_tensor_into_the_fused_layout(tiny_qwen3_dir: Path) -> None:
    model = _load(tiny_qwen3_dir)
    ref = load_file(str(tiny_qwen3_dir / "model.safetensors"))
    layer = model.layers[1]
    q = ref["model.layers.1.self_attn.q_proj.weight"]
    k = ref["model.layers.1.self_attn.k_proj.weight"]
    v = ref["model.layers.1.self_attn.v_proj.weight"]
    assert torch.equal(layer.qkv_weight, torch.cat([q, k, v]))
    gate, up = ref["model.layers.1.mlp.gate_proj.weight"], ref["model.layers.1.mlp.up_proj.weight"]
    assert torch.equal(layer.gate_up_weight, torch.cat([gate, up]))
    qn, kn = ref["model.layers.1.self_attn.q_norm.weight"], ref["model.layers.1.self_attn.k_norm.weight"]
    assert torch.equal(layer.qk_norm, torch.cat([qn.expand(4, -1), kn.expand(2, -1)]))


def test_missing_tensor_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = _copy_model(tiny_llama_dir, tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): model\.layers\.1\.mlp\.up_proj\.weight"):
        _load(d)


def test_unexpected_and_misshaped_tensors_are_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = _copy_model(tiny_llama_dir, tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    sd["model.norm.weight"] = torch.ones(65)
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # harmless extra, ignored
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(ValueError) as e:
        _load(d)
    msg = str(e.value)
    assert "unexpected 1 tensor(s): model.layers.0.self_attn.q_proj.bias" in msg
    assert "model.norm.weight: checkpoint (65,), model expects (64,)" in msg
    assert "inv_freq" not in msg


def test_sharded_checkpoint_loads_the_same(tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "sharded"
    shutil.copytree(tiny_qwen2_dir, d)
    sd = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(sd)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in halves.items():
        save_file({k: sd[k] for k in keys}, str(d / fname))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    a, b = _load(tiny_qwen2_dir), _load(d)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)


def test_no_safetensors_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="convert them to safetensors"):
        _load(tmp_path)


def _load_with(model_dir: Path, threads: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    cfg = load_model_config(model_dir)
    model = build_model(cfg, dtype)
    load_weights(model, model.hf_weight_map(), model_dir, tied_lm_head=cfg.tie_word_embeddings, threads=threads)
    return model


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parallel_loading_equals_sequential(
    sharded: bool, dtype: torch.dtype, tiny_qwen3_dir: Path, tmp_path: Path
) -> None:
    """Pieces read by a thread pool (slices of one file, or shards) fill every parameter exactly as one thread does,
    dtype conversion included."""
    d = tiny_qwen3_dir
    if sharded:
        d = tmp_path / "sharded"
        shutil.copytree(tiny_qwen3_dir, d)
        sd = load_file(str(d / "model.safetensors"))
        (d / "model.safetensors").unlink()
        names = sorted(sd)
        shards = {f"model-0000{i + 1}-of-00003.safetensors": names[i::3] for i in range(3)}
        for fname, keys in shards.items():
            save_file({k: sd[k] for k in keys}, str(d / fname))
        index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    one = _load_with(d, threads=1, dtype=dtype)
    for threads in (2, 5):
        many = _load_with(d, threads=threads, dtype=dtype)
        for (na, pa), (nb, pb) in zip(one.named_parameters(), many.named_parameters(), strict=True):
            assert na == nb and pa.dtype == dtype and torch.equal(pa, pb), na


def test_parallel_loading_reports_problems_like_sequential(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = _copy_model(tiny_llama_dir, tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight"]
    sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(sd, str(d / "model.safetensors"))
    errors = []
    for threads in (1, 4):
        with pytest.raises(ValueError) as e:
            _load_with(d, threads)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "missing 1 tensor(s)" in errors[0] and "unexpected 1" in errors[0]


@pytest.mark.gpu
def test_a_gpu_model_loads_straight_to_the_device(tiny_llama_dir: Path) -> None:
    """Parameters allocated on the GPU and filled tensor by tensor equal the host load."""
    cfg = load_model_config(tiny_llama_dir)
    model = build_model(cfg, torch.bfloat16, device=torch.device("cuda"))
    assert all(p.device.type == "cuda" for p in model.parameters())
    load_weights(model, model.hf_weight_map(), tiny_llama_dir, tied_lm_head=cfg.tie_word_embeddings)
    host = _load_with(tiny_llama_dir, threads=1, dtype=torch.bfloat16)
    for (na, pa), (_, pb) in zip(model.named_parameters(), host.named_parameters(), strict=True):
        assert torch.equal(pa.cpu(), pb), na


def test_gemma3_config_in_its_older_spelling() -> None:
    """Gemma 3 as its released config.json spells it (before transformers 5's per-layer-type rope_parameters):
    rope_theta + rope_scaling for global layers, rope_local_base_freq for local ones, sliding_window_pattern."""
    cfg = parse_model_config(
        dict(
            BASE,
            architectures=["Gemma3ForCausalLM"],
            model_type="gemma3_text",
            num_hidden_layers=12,
            head_dim=16,
            rope_theta=1e6,
            rope_local_base_freq=1e4,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            sliding_window=512,
            sliding_window_pattern=6,
            query_pre_attn_scalar=256,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            hidden_activation="gelu_pytorch_tanh",
        )
    )
    assert cfg.rope_theta == 1e6 and cfg.local_rope_theta == 1e4
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert cfg.layer_windows == ((512,) * 5 + (0,)) * 2
    assert cfg.softmax_scale == 256**-0.5 and cfg.attn_softcap == 0.0 and cfg.final_softcap == 0.0
    assert (
        cfg.embed_scale == 32**0.5 and cfg.qk_norm and cfg.tie_word_embeddings and cfg.hidden_act == "gelu_pytorch_tanh"
    )


def test_released_mistral_and_phi3_configs() -> None:
    """Mistral-7B-v0.1 (window 4096) and v0.3 (sliding_window null: full attention), Phi-3-mini-4k (window 2047,
    RoPE over the whole head), Phi-4-mini's partial RoPE (0.75 of the head)."""
    mistral = dict(BASE, architectures=["MistralForCausalLM"], model_type="mistral", rope_theta=1e4)
    assert parse_model_config(dict(mistral, sliding_window=4096)).layer_windows == (4096, 4096)
    assert parse_model_config(dict(mistral, sliding_window=None)).layer_windows == ()
    phi = dict(BASE, architectures=["Phi3ForCausalLM"], model_type="phi3", rope_scaling=None, sliding_window=2047)
    p = parse_model_config(phi)
    assert p.layer_windows == (2047, 2047) and p.rotary_dim == 0 and p.model_type == "phi3"
    assert parse_model_config(dict(phi, partial_rotary_factor=0.75)).rotary_dim == 6  # head_dim 8


def test_released_moe_configs() -> None:
    """Qwen3-30B-A3B, Mixtral-8x7B and gpt-oss-20b as their config.json files spell them (the fields that matter),
    and the names of the tensors the model built from each expects (on the meta device: nothing allocated)."""
    qwen = dict(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_window_layers=48,
        use_sliding_window=False,
        sliding_window=None,
        rope_scaling=None,
        rope_theta=1e6,
    )
    q = parse_model_config(qwen)
    assert (q.num_experts, q.experts_per_token, q.moe_intermediate_size) == (128, 8, 768)
    assert q.moe_layers == tuple(range(48)) and q.norm_topk_prob and q.qk_norm and q.layer_windows == ()
    mixtral = dict(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
        rope_theta=1e6,
        sliding_window=None,
    )
    m = parse_model_config(mixtral)
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (8, 2, 14336) and m.layer_windows == ()
    yarn = {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    }
    gpt_oss = dict(
        architectures=["GptOssForCausalLM"],
        model_type="gpt_oss",
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=24,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=32,
        num_experts_per_tok=4,
        experts_per_token=4,
        layer_types=["sliding_attention", "full_attention"] * 12,
        sliding_window=128,
        rope_scaling=yarn,
        rope_theta=150000,
        swiglu_limit=7.0,
        attention_bias=True,
        max_position_embeddings=131072,
    )
    with pytest.raises(ValueError, match="quantization 'mxfp4'"):  # the released checkpoint's experts are MXFP4
        parse_model_config(dict(gpt_oss, quantization_config={"quant_method": "mxfp4"}))
    g = parse_model_config(gpt_oss)  # a BF16 export
    assert (g.num_experts, g.experts_per_token, g.moe_intermediate_size) == (32, 4, 2880)
    assert g.layer_windows == (128, 0) * 12 and g.attn_sinks and g.qkv_bias and g.o_bias and g.moe_kind == "gpt_oss"
    assert g.rope_theta == 150000 and g.rope_scaling is not None and g.rope_scaling["rope_type"] == "yarn"
    small = {"num_hidden_layers": 2, "vocab_size": 64}  # the names per layer, without building 48 layers
    names = set(
        build_model(
            parse_model_config(dict(qwen, **small)), torch.float32, 4, device=torch.device("meta")
        ).hf_weight_map()
    )
    assert "model.layers.1.mlp.experts.127.down_proj.weight" in names and "model.layers.0.mlp.gate.weight" in names
    names = set(
        build_model(
            parse_model_config(dict(mixtral, **small)), torch.float32, 4, device=torch.device("meta")
        ).hf_weight_map()
    )
    assert "model.layers.1.block_sparse_moe.experts.7.w3.weight" in names
    names = set(
        build_model(
            parse_model_config(dict(gpt_oss, **small, layer_types=["sliding_attention", "full_attention"])),
            torch.float32,
            4,
            device=torch.device("meta"),
        ).hf_weight_map()
    )
    assert {
        "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.0.self_attn.sinks",
        "model.layers.1.mlp.router.bias",
    } <= names
