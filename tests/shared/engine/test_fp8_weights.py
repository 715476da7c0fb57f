"""FP8 block-wise weights (e4m3 + weight_scale_inv per 128 x 128 block, the DeepSeek-V3 / Qwen3-FP8 layout): a tiny
random Llama quantized here, served with its projections 1 byte per weight in memory, against transformers running
the dequantized weights.

Tolerance: logits within 1e-4 of transformers (fp32), the same bar as unquantized checkpoints: both sides compute
the same dequantized fp32 weights (fp8 -> fp32 is exact, then one product by the block's scale), so what is left is
GEMM summation order. Greedy tokens identical on 3 prompts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.modelspec.sampling import SamplingParams
from tests.helpers.quantized_models import quantize_checkpoint
from tests.helpers.tiny_models import make_tiny_model

TOL = 1e-4


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory: pytest.TempPathFactory):
    """(HF on the dequantized weights, our runner on the fp8 checkpoint). hidden 256 / 4 heads / 2 KV heads: the
    k and v projections (128 rows each) and the intermediate size (544: a partial block) cross block edges."""
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp("fp8")
    src = make_tiny_model(tmp, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    dst = tmp / "llama-fp8"
    dequant = quantize_checkpoint(src, dst)
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    missing = hf.load_state_dict(dequant, strict=False).unexpected_keys
    assert not missing
    runner = ModelRunner(dst, num_pages=64, page_size=4, attention_backend="torch")
    return hf, runner, dst


def test_projections_stay_one_byte_in_memory(fp8_pair) -> None:
    _, runner, _ = fp8_pair
    layer = runner.model.layers[0]
    packed = layer.packed["qkv"]
    assert isinstance(packed, Fp8BlockWeight) and packed.weight.dtype == torch.float8_e4m3fn
    assert packed.weight.element_size() == 1 and packed.shape == (256 + 2 * 128, 256)
    assert layer.gate_up_weight.dtype == torch.float8_e4m3fn and layer.down_weight.shape == (256, 544)
    assert runner.linear.name == "dequant"


def _hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def test_logits_match_transformers_on_the_dequantized_weights(fp8_pair) -> None:
    hf, runner, _ = fp8_pair
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, runner.vocab_size, (n,), generator=g).tolist() for n in (5, 13, 30)]
    pages, start = [], 0
    for p in prompts:
        n = -(-len(p) // 4)
        pages.append(tuple(range(start, start + n)))
        start += n
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages[i], True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    worst = max((logits[i] - _hf_logits(hf, p)[-1]).abs().max().item() for i, p in enumerate(prompts))
    assert worst <= TOL, f"max abs logit diff {worst:.2e}"


def test_greedy_tokens_match_transformers_on_3_prompts(fp8_pair) -> None:
    hf, runner, _ = fp8_pair
    engine = Engine(runner, cache=CacheConfig(page_size=4), scheduler=SchedulerConfig(max_prefill_tokens=64))
    prompts = [[5, 17, 99, 3], list(range(40, 61)), [250, 7, 7, 7, 300, 12]]
    from transformers import GenerationConfig

    got = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    hf.generation_config.eos_token_id = None  # ignore_eos: a GenerationConfig argument cannot unset it
    cfg = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    for p, c in zip(prompts, got, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), generation_config=cfg)
        assert list(c.token_ids) == ref[0, len(p) :].tolist()


def test_a_missing_scale_is_named(fp8_pair, tmp_path: Path) -> None:
    _, _, dst = fp8_pair
    broken = tmp_path / "broken"
    shutil.copytree(dst, broken)
    state = load_file(broken / "model.safetensors")
    del state["model.layers.1.mlp.down_proj.weight_scale_inv"]
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): model.layers.1.mlp.down_proj.weight_scale_inv"):
        ModelRunner(broken, num_pages=8, page_size=4)


def test_quantization_fp8_quantizes_an_unquantized_checkpoint_at_load(tmp_path: Path) -> None:
    """--quantization fp8 over fp32 weights: each fused projection in 128 x 128 blocks of its own rows, 1 byte per
    weight; logits within 1e-4 of transformers on the weights those blocks dequantize to."""
    from transformers import AutoModelForCausalLM

    src = make_tiny_model(tmp_path, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    runner = ModelRunner(src, quantization="fp8", num_pages=64, page_size=4, attention_backend="torch")
    plain = ModelRunner(src, num_pages=8, page_size=4)
    assert runner.model.weight_bytes < 0.4 * plain.model.weight_bytes  # the projections at 1 byte (+3% scales)
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    deq = {}
    for i, layer in enumerate(runner.model.layers):
        qkv, gate_up = layer.packed["qkv"].dequantize(), layer.packed["gate_up"].dequantize()
        pre = f"model.layers.{i}."
        (
            deq[pre + "self_attn.q_proj.weight"],
            deq[pre + "self_attn.k_proj.weight"],
            deq[pre + "self_attn.v_proj.weight"],
        ) = qkv.split([256, 128, 128])
        deq[pre + "mlp.gate_proj.weight"], deq[pre + "mlp.up_proj.weight"] = gate_up.chunk(2)
        deq[pre + "self_attn.o_proj.weight"] = layer.packed["o"].dequantize()
        deq[pre + "mlp.down_proj.weight"] = layer.packed["down"].dequantize()
    assert not hf.load_state_dict(deq, strict=False).unexpected_keys
    p = list(range(9, 40))
    seq = ScheduledSeq("a", tuple(p), 0, tuple(range(8)), True)
    diff = (runner.forward(SchedulerOutput((seq,)))[0] - _hf_logits(hf, p)[-1]).abs().max().item()
    assert diff <= TOL, f"max abs logit diff {diff:.2e}"
    with pytest.raises(ValueError, match="only fp8 quantizes an unquantized checkpoint"):
        ModelRunner(src, quantization="awq", num_pages=8, page_size=4)
