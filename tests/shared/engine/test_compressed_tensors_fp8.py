"""compressed-tensors FP8 checkpoints (llm-compressor's FP8_DYNAMIC: e4m3 + a weight_scale per output channel; FP8:
one weight_scale per tensor and a static input_scale): a tiny random Llama quantized here into that layout, served
with its projections 1 byte per weight, against transformers running the dequantized weights.

Tolerance: logits within 1e-4 of transformers (fp32), as for unquantized checkpoints: both sides compute the same
dequantized fp32 weights (fp8 -> fp32 is exact, then one product by the scale), so what is left is GEMM summation
order. Greedy tokens identical on 3 prompts. The input_scale is not used (activations run unquantized), so the
reference is transformers on the dequantized weights with unquantized activations.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.config.quantization import QuantSpec, parse_quantization
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.kernels.fp8_weight import Fp8BlockWeight
from shared.modelspec.sampling import SamplingParams
from tests.helpers.quantized_models import ct_config, quantize_checkpoint_ct
from tests.helpers.tiny_models import make_tiny_model

TOL = 1e-4


@pytest.fixture(scope="module", params=["channel", "tensor"])
def ct_pair(request, tmp_path_factory: pytest.TempPathFactory):
    """(HF on the dequantized weights, our runner on the compressed-tensors checkpoint, its dir, the strategy)."""
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp(f"ct-{request.param}")
    src = make_tiny_model(tmp, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    dst = tmp / "llama-ct"
    dequant = quantize_checkpoint_ct(src, dst, request.param)
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    assert not hf.load_state_dict(dequant, strict=False).unexpected_keys
    runner = ModelRunner(dst, num_pages=64, page_size=4, attention_backend="torch")
    return hf, runner, dst, request.param


def test_the_config_parses_as_fp8_per_channel_or_per_tensor(ct_pair) -> None:
    _, runner, dst, strategy = ct_pair
    spec = parse_quantization(json.loads((dst / "config.json").read_text()))
    assert spec == QuantSpec("fp8", (1, 0), "weight_scale", strategy=strategy, declared="compressed-tensors")
    layer = runner.model.layers[0]
    packed = layer.packed["qkv"]
    assert isinstance(packed, Fp8BlockWeight) and packed.weight.dtype == torch.float8_e4m3fn
    assert packed.shape == (512, 256) and packed.scale.shape == (512, 1) and packed.block_k == 256
    if strategy == "tensor":  # q, k and v keep their own scale, each over its rows
        s = packed.scale[:, 0]
        assert (s[:256] == s[0]).all() and (s[256:384] == s[256]).all() and (s[384:] == s[384]).all()
        assert len({float(s[0]), float(s[256]), float(s[384])}) == 3
    assert layer.down_weight.dtype == torch.float8_e4m3fn and runner.linear.name == "dequant"


def test_quantization_flag_may_name_fp8_or_compressed_tensors(ct_pair) -> None:
    _, _, dst, strategy = ct_pair
    if strategy == "tensor":
        return  # the flag's check does not depend on the strategy
    for name in ("compressed-tensors", "fp8"):
        assert ModelRunner(dst, quantization=name, num_pages=8, page_size=4).quant is not None
    with pytest.raises(ValueError, match="--quantization awq: the checkpoint is quantized with 'fp8'"):
        ModelRunner(dst, quantization="awq", num_pages=8, page_size=4)


def test_logits_match_transformers_on_the_dequantized_weights(ct_pair) -> None:
    hf, runner, _, _ = ct_pair
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, runner.vocab_size, (n,), generator=g).tolist() for n in (5, 13, 30)]
    pages, start = [], 0
    for p in prompts:
        n = -(-len(p) // 4)
        pages.append(tuple(range(start, start + n)))
        start += n
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages[i], True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    with torch.no_grad():
        ref = [hf(torch.tensor([p])).logits[0, -1].float() for p in prompts]
    worst = max((logits[i] - ref[i]).abs().max().item() for i in range(len(prompts)))
    assert worst <= TOL, f"max abs logit diff {worst:.2e}"


def test_greedy_tokens_match_transformers_on_3_prompts(ct_pair) -> None:
    from transformers import GenerationConfig

    hf, runner, _, _ = ct_pair
    engine = Engine(runner, cache=CacheConfig(page_size=4), scheduler=SchedulerConfig(max_prefill_tokens=64))
    prompts = [[5, 17, 99, 3], list(range(40, 61)), [250, 7, 7, 7, 300, 12]]
    got = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    hf.generation_config.eos_token_id = None  # ignore_eos: a GenerationConfig argument cannot unset it
    cfg = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    for p, c in zip(prompts, got, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), generation_config=cfg)
        assert list(c.token_ids) == ref[0, len(p) :].tolist()


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda q: q["config_groups"]["group_0"]["weights"].update(type="int", num_bits=4, strategy="group"),
            "'compressed-tensors (int 4-bit, group)' is not supported",
        ),
        (lambda q: q.update(format="pack-quantized"), "in format 'pack-quantized' is not supported"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block"), "(float 8-bit, block)'"),
        (lambda q: q.update(ignore=["lm_head", "re:.*down_proj"]), "leaving ['lm_head', 're:.*down_proj']"),
        (lambda q: q["config_groups"].update(group_1=q["config_groups"]["group_0"]), "with 2 config groups"),
        (lambda q: q.update(sparsity_config={"format": "sparse-24-bitmask"}), "with sparsity or transforms"),
    ],
)
def test_other_compressed_tensors_schemes_are_refused_by_name(edit, named: str) -> None:
    q = copy.deepcopy(ct_config("channel"))
    edit(q)
    with pytest.raises(ValueError) as e:
        parse_quantization({"quantization_config": q}, source="m/config.json")
    msg = str(e.value)
    assert msg.startswith("m/config.json: ") and named in msg and "\n" not in msg
    assert "supported: fp8 (block-wise" in msg and "compressed-tensors fp8 (e4m3 per channel or per tensor" in msg
