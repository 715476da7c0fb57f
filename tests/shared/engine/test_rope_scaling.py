"""yarn and longrope RoPE scalings against transformers: the tables (inverse frequencies and the cos/sin attention
factor) equal transformers' own functions, and tiny Qwen2 (yarn), Qwen3 (yarn with DeepSeek's mscale pair) and Phi-3
(longrope, partial rotary) checkpoints give logits within 1e-4 and identical greedy tokens, prompt and decode, on
the paged engine. `dynamic` is refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.engine.models import load_model_config
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.kernels.rotary import RotaryCache
from shared.modelspec.sampling import SamplingParams

TOL = 1e-4
HEAD_DIM = 16
ORIGINAL = 48  # original_max_position_embeddings: the tests' prompts stay under it (see rope_scaling.py, longrope)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL, "rope_theta": 10000.0}
YARN_MSCALE = dict(YARN, mscale=0.9, mscale_all_dim=0.7, beta_fast=24, beta_slow=2)


def _longrope(dim: int) -> dict:
    g = torch.Generator().manual_seed(1)
    short = (1.0 + torch.rand(dim // 2, generator=g)).tolist()
    long = (2.0 + 4 * torch.rand(dim // 2, generator=g)).tolist()
    return {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": ORIGINAL,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
    }


def _config(arch: str, rope: dict):  # -> (config, model class)
    import transformers

    common = dict(
        vocab_size=256,
        hidden_size=9 * HEAD_DIM,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=4 * ORIGINAL,
        rope_parameters=rope,
        tie_word_embeddings=False,
    )
    if arch == "qwen2":
        return transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=HEAD_DIM), transformers.Qwen3ForCausalLM
    phi3 = transformers.Phi3Config(**common, pad_token_id=0, original_max_position_embeddings=ORIGINAL)
    return phi3, transformers.Phi3ForCausalLM


CASES = {"qwen2-yarn": ("qwen2", YARN), "qwen3-yarn-mscale": ("qwen3", YARN_MSCALE), "phi3-longrope": ("phi3", None)}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    arch, rope = CASES[request.param]
    cfg, cls = _config(arch, rope if rope is not None else _longrope(HEAD_DIM // 2))
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p)) if name.endswith("norm.weight") else p.normal_(0.0, 0.08)
    out = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(out, safe_serialization=True)
    hf = type(hf).from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    return request.param, out, hf


def test_tables_equal_transformers(pair) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    _, out, hf = pair
    arch = load_model_config(out)
    rope = hf.config.rope_parameters
    inv, attention = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf.config, torch.device("cpu"))
    dim = arch.rotary_dim or arch.head_dim
    ours = RotaryCache(dim, 4 * ORIGINAL, arch.rope_theta, arch.rope_scaling, model_max_positions=4 * ORIGINAL)
    t = torch.arange(ORIGINAL, dtype=torch.float32)
    torch.testing.assert_close(ours.cos[:ORIGINAL], torch.outer(t, inv).cos() * attention, rtol=0, atol=1e-6)
    assert attention != 1.0  # the factor is part of what is compared
    if rope["rope_type"] == "longrope":  # past the original length: the long factors, position by position
        long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](hf.config, torch.device("cpu"), seq_len=ORIGINAL + 1)
        t = torch.arange(ORIGINAL, 4 * ORIGINAL, dtype=torch.float32)
        torch.testing.assert_close(ours.cos[ORIGINAL:], torch.outer(t, long_inv).cos() * attention, rtol=0, atol=1e-6)


def test_logits_match_transformers(pair) -> None:
    name, out, hf = pair
    runner = ModelRunner(out, num_pages=64, page_size=4)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 6, 13, 40)]
    free = iter(torch.randperm(64, generator=g).tolist())
    seqs = tuple(
        ScheduledSeq(f"r{i}", tuple(p), 0, tuple(next(free) for _ in range(-(-len(p) // 4))), True)
        for i, p in enumerate(prompts)
    )
    logits = runner.forward(SchedulerOutput(seqs))
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0, -1]
        diff = (logits[i] - ref).abs().max().item()
        assert diff <= TOL, f"{name}: prompt {i}: max abs logit diff {diff:.2e}"


def test_greedy_decode_matches_transformers(pair) -> None:
    name, out, hf = pair
    runner = ModelRunner(out, num_pages=64, page_size=4)
    engine = Engine(runner, cache=CacheConfig(page_size=4), scheduler=SchedulerConfig(max_prefill_tokens=64))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 17, 30)]
    got = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))  # 42 < ORIGINAL
    for p, c in zip(prompts, got, strict=True):
        ids = list(p)
        with torch.no_grad():
            for k, tok in enumerate(c.token_ids):
                assert int(hf(torch.tensor([ids])).logits[0, -1].argmax()) == tok, f"{name}: token {k} differs"
                ids.append(tok)


def test_dynamic_ntk_is_refused_naming_the_field(tmp_path: Path) -> None:
    cfg, _ = _config("qwen2", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    cfg.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["rope_parameters"]["rope_type"] == "dynamic"
    with pytest.raises(ValueError, match="rope_type 'dynamic' is not supported"):
        load_model_config(tmp_path)
