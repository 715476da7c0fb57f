"""--tp-size against the model: heads and MLP split evenly, KV heads split or replicated, else one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.config import ConfigError, PassContext, resolve
from shared.config.tp_rules import kv_heads_replicated, tp_layout_problem


def test_rules_split_replicate_or_refuse() -> None:
    assert tp_layout_problem(8, 4, 64, 2) is None and not kv_heads_replicated(4, 2)
    assert tp_layout_problem(8, 2, 64, 4) is None and kv_heads_replicated(2, 4)  # 2 KV heads, each on 2 ranks
    assert tp_layout_problem(14, 2, 4864, 2) is None  # Qwen2.5-0.5B at TP=2
    # SmolLM2-135M (the bundled model): 9 heads and 3 KV heads split over 3 ranks, not 2
    assert tp_layout_problem(9, 3, 1536, 3) is None
    assert tp_layout_problem(9, 3, 1536, 2) == (
        "--tp-size 2 does not divide the model's 9 attention heads (9 % 2 = 1); use --tp-size 1, 3"
    )
    assert tp_layout_problem(8, 4, 64, 3) == (
        "--tp-size 3 does not divide the model's 8 attention heads (8 % 3 = 2); use --tp-size 1, 2, 4, 8"
    )
    assert tp_layout_problem(12, 4, 48, 6) == (
        "--tp-size 6 fits neither way with the model's 4 KV heads (split needs 4 % 6 == 0, replication needs "
        "6 % 4 == 0); use --tp-size 1, 2, 4, 12"
    )
    assert tp_layout_problem(8, 8, 66, 4) == (
        "--tp-size 4 does not divide the model's MLP intermediate size 66 (66 % 4 = 2); use --tp-size 1, 2"
    )


def _model(d: Path, heads: int, kv: int) -> str:
    d.mkdir()
    cfg = {"num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": 96, "hidden_size": 48}
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_config_checks_tp_against_the_model_at_start(tmp_path: Path, ctx: PassContext) -> None:
    model = _model(tmp_path / "a", heads=8, kv=4)
    argv = ["--model", model, "--tp-size", "3"]
    with pytest.raises(ConfigError, match=r"^--tp-size 3 does not divide the model's 8 attention heads \(8 % 3 = 2\)"):
        resolve("worker", argv, env={}, ctx=ctx)
    with pytest.raises(ConfigError, match=r"fits neither way with the model's 4 KV heads"):
        resolve("worker", ["--model", _model(tmp_path / "b", heads=12, kv=4), "--tp-size", "6"], env={}, ctx=ctx)
    assert resolve("worker", ["--model", model, "--tp-size", "2"], env={}, ctx=ctx).parallel.tp_size == 2


def test_config_refuses_tp_for_mla_models_at_start(tmp_path: Path, ctx: PassContext) -> None:
    model = _model(tmp_path / "ds", heads=8, kv=8)  # a head count --tp-size 2 would divide
    cfg = json.loads((Path(model) / "config.json").read_text())
    cfg.update(architectures=["DeepseekV3ForCausalLM"], kv_lora_rank=16, qk_rope_head_dim=4)
    (Path(model) / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"^--tp-size 2: DeepseekV3ForCausalLM .*kv_lora_rank.* --tp-size 1 only"):
        resolve("worker", ["--model", model, "--tp-size", "2"], env={}, ctx=ctx)


def test_more_ranks_than_gpus_names_the_numbers(make_ctx) -> None:
    with pytest.raises(ConfigError, match=r"^--tp-size 8 x --dp-size 1 needs 8 GPUs but 4 are visible"):
        resolve("worker", ["--tp-size", "8"], env={}, ctx=make_ctx(cuda=True, gpus=4))
