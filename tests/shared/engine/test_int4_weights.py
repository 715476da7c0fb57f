"""int4 weights, AWQ (4-bit, zero point, AutoAWQ's GEMM packing) and GPTQ (4-bit, grouped, v1 zero points): a tiny
random Llama quantized and packed here in each format, served with its projections half a byte per weight in memory,
against transformers running the dequantized weights.

Tolerance: logits within 1e-4 of transformers (fp32): both sides hold the same dequantized fp32 weights ((q - zero)
x the float16 scale, exact in fp32), so what is left is GEMM summation order. Greedy tokens identical on 3 prompts.
Group size 32 here: the tiny model's intermediate size (544) is no multiple of 128.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.kernels.int4_weight import _SHIFTS, Int4Weight, pack_int4, unpack_int4
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import make_tiny_model

TOL = 1e-4
GROUP = 32
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _pack_seq(v: torch.Tensor) -> torch.Tensor:
    """GPTQ's packing: [rows, cols] 0..15 -> [rows / 8, cols] int32, nibble j <- row 8r + j."""
    rows, cols = v.shape
    return (v.to(torch.int32).view(rows // 8, 8, cols) << _SHIFTS.view(1, 8, 1)).sum(dim=1, dtype=torch.int32)


def quantize_int4(w: torch.Tensor, fmt: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """[out, in] -> (the checkpoint's tensors in `fmt`; the dequantized weight). awq: qweight [in, out/8], qzeros
    [in/G, out/8]; gptq: qweight [in/8, out], qzeros [in/G, out/8] holding zero - 1, g_idx [in]; scales [in/G, out]."""
    out, k = w.shape
    g = w.view(out, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo).clamp(min=1e-6) / 15).to(torch.float16)
    zero = (-lo / scale.float()).round().clamp(1, 15)  # >= 1: GPTQ v1 cannot store a zero point of 0
    q = (g / scale.float().unsqueeze(-1)).round().add(zero.unsqueeze(-1)).clamp(0, 15)
    deq = ((q - zero.unsqueeze(-1)) * scale.float().unsqueeze(-1)).view(out, k)
    q, zero = q.view(out, k).to(torch.int32), zero.to(torch.int32)
    if fmt == "awq":
        tensors = {"qweight": pack_int4(q).t().contiguous(), "qzeros": pack_int4(zero).t().contiguous()}
    else:
        g_idx = torch.arange(k, dtype=torch.int32) // GROUP
        tensors = {"qweight": _pack_seq(q.t()), "qzeros": _pack_seq(zero - 1).t().contiguous(), "g_idx": g_idx}
    return tensors | {"scales": scale.t().contiguous()}, deq


QUANT_CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": False},
}


def quantize_checkpoint(src: Path, dst: Path, fmt: str) -> dict[str, torch.Tensor]:
    shutil.copytree(src, dst)
    out, dequant = {}, {}
    for name, w in load_file(src / "model.safetensors").items():
        if name.endswith(".weight") and name.split(".")[-2] in _PROJ:
            tensors, dequant[name] = quantize_int4(w, fmt)
            out.update({name.removesuffix("weight") + k: t for k, t in tensors.items()})
        else:
            out[name] = w
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = QUANT_CONFIGS[fmt]
    (dst / "config.json").write_text(json.dumps(cfg))
    return dequant


def test_packing_round_trips_and_follows_awqs_nibble_order() -> None:
    v = torch.randint(0, 16, (16, 3), generator=torch.Generator().manual_seed(0))
    packed = pack_int4(v)
    assert torch.equal(unpack_int4(packed), v.to(torch.int32))
    for j, col in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):  # nibble j <- output column 8c + order[j]
        assert torch.equal((packed[0] >> (4 * j)) & 0xF, v[col].to(torch.int32))


@pytest.fixture(scope="module", params=["awq", "gptq"])
def int4_pair(request, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp(request.param)
    src = make_tiny_model(tmp, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    dequant = quantize_checkpoint(src, tmp / "llama-int4", request.param)
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    assert not hf.load_state_dict(dequant, strict=False).unexpected_keys
    runner = ModelRunner(tmp / "llama-int4", num_pages=64, page_size=4, attention_backend="torch")
    assert runner.quant is not None and runner.quant.method == request.param
    return hf, runner


def test_projections_stay_half_a_byte_in_memory(int4_pair) -> None:
    _, runner = int4_pair
    layer = runner.model.layers[0]
    qkv = layer.packed["qkv"]
    assert isinstance(qkv, Int4Weight) and qkv.shape == (512, 256) and qkv.qweight.dtype == torch.int32
    assert qkv.packing == runner.quant.method
    assert layer.qkv_weight.numel() == 0 and runner.linear.name == "dequant"
    int4 = sum(getattr(layer, f"{k}_qweight").nbytes for k in ("qkv", "o", "gate_up", "down"))
    assert int4 * 2 == 512 * 256 + 256 * 256 + 1088 * 256 + 256 * 544  # half a byte per weight


def test_logits_and_greedy_match_transformers_on_the_dequantized_weights(int4_pair) -> None:
    from transformers import GenerationConfig

    hf, runner = int4_pair
    p = list(range(9, 40))
    seq = ScheduledSeq("a", tuple(p), 0, tuple(range(8)), True)
    with torch.no_grad():
        ref = hf(torch.tensor([p])).logits[0, -1].float()
    diff = (runner.forward(SchedulerOutput((seq,)))[0] - ref).abs().max().item()
    assert diff <= TOL, f"max abs logit diff {diff:.2e}"
    engine = Engine(runner, cache=CacheConfig(page_size=4), scheduler=SchedulerConfig(max_prefill_tokens=64))
    prompts = [[5, 17, 99, 3], list(range(40, 61)), [250, 7, 7, 7, 300, 12]]
    got = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    hf.generation_config.eos_token_id = None
    cfg = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    for prompt, c in zip(prompts, got, strict=True):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), generation_config=cfg)[0, len(prompt) :].tolist()
        assert list(c.token_ids) == want
