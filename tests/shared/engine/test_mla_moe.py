"""DeepSeek-V2 / V3 MoE layers beyond the shared parity tests of test_mla_deepseek.py (which run the "v2-moe" and
"v3-moe" checkpoints through every path): the layers are built as the config says, the router's knobs each bite
(a model without them drifts from transformers), and the experts run as grouped GEMMs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.engine.model_runner import ModelRunner
from shared.engine.models.deepseek import MLADecoderLayer
from shared.engine.models.moe import DeepseekMoEBlock
from shared.engine.types import ScheduledSeq, SchedulerOutput
from tests.helpers.tiny_mla import make_tiny_mla

PAGE = 4


@pytest.fixture(scope="module", params=["v2-moe", "v3-moe"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    d: Path = make_tiny_mla(tmp_path_factory.mktemp("mla-moe"), request.param)
    hf = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    return ModelRunner(d, num_pages=32, page_size=PAGE), hf


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (4, 9, 14)]


def _diff(runner: ModelRunner, hf) -> float:
    """The max abs logit difference of one batched prefill of three prompts against transformers."""
    prompts = _prompts(runner.vocab_size)
    free = iter(range(runner.num_pages))
    seqs = tuple(
        ScheduledSeq(f"s{i}", tuple(p), 0, tuple(next(free) for _ in range(-(-len(p) // PAGE))), True)
        for i, p in enumerate(prompts)
    )
    logits = runner.forward(SchedulerOutput(seqs))
    worst = 0.0
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0, -1].float()
        worst = max(worst, (logits[i] - ref).abs().max().item())
    return worst


def _moe(runner: ModelRunner) -> list[DeepseekMoEBlock]:
    layers = [layer for layer in runner.model.layers if isinstance(layer, MLADecoderLayer)]
    return [layer.moe for layer in layers if layer.moe is not None]


def test_layers_from_first_k_dense_replace_are_moe(pair) -> None:
    runner, _ = pair
    arch = runner.arch
    assert arch.moe_layers == (1, 2) and arch.num_experts == 8 and arch.experts_per_token == 2
    kept = 2 if arch.moe_kind == "deepseek_v3" else 1
    assert (arch.expert_groups, arch.topk_groups, arch.shared_experts) == (4, kept, 1)
    assert arch.routed_scaling_factor != 1.0
    layers = runner.model.layers
    assert layers[0].moe is None and layers[0].dense_inter == 96  # intermediate_size
    assert all(layer.dense_inter == 16 for layer in layers[1:])  # 1 shared expert of moe_intermediate_size
    blocks = _moe(runner)
    assert len(blocks) == 2 and all(b.stacked for b in blocks)
    v3 = arch.moe_kind == "deepseek_v3"
    assert all((b.correction is not None) == v3 and b.sigmoid == v3 for b in blocks)


def test_each_router_knob_bites(pair) -> None:
    """Exact with the checkpoint's router; without the scaling factor, the groups or the correction bias (zeroed),
    the logits leave transformers' (so the parity tests check each of them)."""
    runner, hf = pair
    assert _diff(runner, hf) <= 1e-4
    blocks = _moe(runner)
    knobs: list[tuple[str, object]] = [("scale", 1.0), ("groups", 1)]
    for attr, plain in knobs:
        saved = [getattr(b, attr) for b in blocks]
        for b in blocks:
            setattr(b, attr, plain)
        assert _diff(runner, hf) > 1e-3, f"{attr} changes nothing"
        for b, value in zip(blocks, saved, strict=True):
            setattr(b, attr, value)
    if blocks[0].correction is not None:
        saved = [b.correction.data.clone() for b in blocks if b.correction is not None]
        for b in blocks:
            assert b.correction is not None and b.correction.abs().max() > 0.1
            b.correction.data.zero_()
        assert _diff(runner, hf) > 1e-3, "the correction bias changes nothing"
        for b, value in zip(blocks, saved, strict=True):
            assert b.correction is not None
            b.correction.data.copy_(value)
    assert _diff(runner, hf) <= 1e-4


def test_experts_are_one_grouped_call(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    runner, _ = pair
    calls: list[int] = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = _prompts(runner.vocab_size)[2]
    runner.forward(SchedulerOutput((ScheduledSeq("g", tuple(p), 0, (0, 1, 2, 3), True),)))
    assert len(calls) == 2 * len(_moe(runner))  # gate_up and down, per MoE layer


@pytest.mark.parametrize(
    ("variant", "overrides"),
    [
        ("v2-moe", {"topk_method": "greedy", "n_shared_experts": 2}),  # V2-Lite's router, 2 shared experts
        ("v3-moe", {"n_group": 1, "topk_group": 1, "norm_topk_prob": False}),  # one group, weights not renormalised
    ],
)
def test_other_router_settings_match_transformers(variant: str, overrides: dict[str, object], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    d = make_tiny_mla(tmp_path, variant, seed=1, **overrides)
    hf = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    runner = ModelRunner(d, num_pages=32, page_size=PAGE)
    assert runner.arch.expert_groups == 1 and runner.model.layers[1].dense_inter == 16 * runner.arch.shared_experts
    assert _diff(runner, hf) <= 1e-4
