"""The fp8 KV cache (--kv-cache-dtype fp8_e4m3): 1-byte pages, quantized as written and widened as read.

Tolerance (README, "Quantized checkpoints and an fp8 KV cache"): on the bundled SmolLM2-135M, 8 chat prompts x 32
free-running greedy tokens match the fp32-KV path on >= 7 of 8 prompts, a match being identical tokens or a first
difference at a near-tie of both paths (TIE below); teacher-forced, fp8 KV picks fp32 KV's top-1 token at >= 90% of
the positions. fp8 e4m3 keeps 3 mantissa bits, a relative error of up to 6% per K/V element: logits move by up to
1.7 on this small model, enough to flip its near-ties, so most free-running outputs part at one (numbers below).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.kv_pool import KVPool
from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.kv_layout import KVLayout
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401

FP8 = KVLayout(dtype="fp8_e4m3", page_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def test_fp8_pool_pages_are_one_byte_and_writes_round_to_e4m3() -> None:
    pool = KVPool(FP8, 4)
    assert pool.buffer.dtype == torch.float8_e4m3fn and pool.quantized
    assert FP8.page_bytes * 2 == dataclasses.replace(FP8, dtype="bfloat16").page_bytes
    assert FP8.page_bytes * 4 == dataclasses.replace(FP8, dtype="float32").page_bytes
    k = torch.tensor([[[0.1, -3.3, 1000.0, -1e6, 0.0, 2.0, 7.5, 1e-9]] * 2])  # [1 token, 2 heads, 8]
    kq, vq = pool.quantize(0, k, -k)
    assert kq.dtype == torch.float32 and torch.isfinite(kq).all()
    assert kq[0, 0, 2] == 448.0 and kq[0, 0, 3] == -448.0  # clamped to e4m3's range, never NaN
    assert (kq - k).abs()[k.abs() < 448].max() <= 0.07 * 3.3  # 3 mantissa bits
    pool.write(1, torch.tensor([2]), torch.tensor([3]), kq, vq)
    assert torch.equal(pool.k(1)[2, 3].float(), kq[0]) and torch.equal(pool.v(1)[2, 3].float(), vq[0])
    pool.copy_pages([(2, 0)])
    assert torch.equal(pool.page_view(0).view(torch.uint8), pool.page_view(2).view(torch.uint8))
    assert pool.pages_checksum([0]) == pool.pages_checksum([2])


def test_per_layer_scales_divide_on_write() -> None:
    pool = KVPool(FP8, 2)
    pool.set_scales([2.0, 0.5], [4.0, 1.0])
    k = torch.full((1, 2, 8), 3.0)
    kq, vq = pool.quantize(0, k, k)
    assert (kq == 1.5).all() and (vq == 0.75).all()  # page units: k / k_scale
    with pytest.raises(ValueError, match="2 positive numbers"):
        pool.set_scales([1.0], [1.0])


def _engine(model_dir: Path, kv: str | None, **kw) -> Engine:
    runner = ModelRunner(model_dir, kv_cache_dtype=kv, page_size=16, attention_backend="torch", **kw)
    sched = SchedulerConfig(max_running_requests=8, chunked_prefill_size=64, max_prefill_tokens=64)
    return Engine(runner, cache=CacheConfig(page_size=16), scheduler=sched)


def test_tiny_model_fp8_kv_runs_on_the_torch_ops_and_a_prefix_hit_changes_nothing(tiny_llama_dir: Path) -> None:
    e = _engine(tiny_llama_dir, "fp8_e4m3", num_pages=64)
    assert e.runner.layout.dtype == "fp8_e4m3" and e.runner.attn.name == "torch"
    prompt = list(range(5, 45))
    first = e.generate([prompt], GREEDY)[0].token_ids
    again = e.generate([prompt], GREEDY)[0].token_ids  # its full pages now come from the radix cache
    assert e.stats.num_cached_prompt_tokens >= 32
    assert again == first  # the step's own K/V are the numbers the pages hold (kv_pool.quantize)
    with pytest.raises(ValueError, match=r"reads KV pages of the model's dtype \(float32\), not fp8_e4m3"):
        ModelRunner(tiny_llama_dir, kv_cache_dtype="fp8_e4m3", num_pages=8, attention_backend="native")


def _teacher_forced(runner: ModelRunner, prompts: list[list[int]], forced: list[list[int]] | None, n: int):
    """Greedy (forced None) or teacher-forced decoding of n tokens per prompt in one batch: (tokens, logits)."""
    pages = [tuple(range(16 * i, 16 * i + 16)) for i in range(len(prompts))]
    toks = [list(p) for p in prompts]
    out = SchedulerOutput(tuple(ScheduledSeq(f"s{i}", tuple(t), 0, pages[i], True) for i, t in enumerate(toks)))
    logits = []
    for step in range(n):
        lg = runner.forward(out)
        logits.append(lg)
        for i, t in enumerate(toks):
            t.append(int(lg[i].argmax()) if forced is None else forced[i][len(prompts[i]) + step])
        out = SchedulerOutput(
            tuple(ScheduledSeq(f"s{i}", (t[-1],), len(t) - 1, pages[i], True) for i, t in enumerate(toks))
        )
    return toks, torch.stack(logits)


# A divergence counts as a match only at a near-tie of both paths: each one's logits put the other's token within TIE
# of its own pick. TIE is fp8 KV's own noise on this model, measured teacher-forced on the fp32-KV tokens: it moves
# the fp32 top-2 margin by a median 0.13, p90 0.48, p99 1.05, max 1.66 (bf16 KV: p99 0.08). A gap under that is one
# the fp32 path itself holds to less than the rounding of its K/V to 3 mantissa bits.
TIE = 1.0
TOKENS = 32


def _first_divergence(a: list[int], b: list[int]) -> int:
    return next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))


@pytest.mark.slow
def test_bundled_model_with_fp8_kv_follows_fp32_kv(bundled_model_dir: Path) -> None:
    """8 chat prompts x 32 free-running greedy tokens, fp32 KV against fp8 KV (scale 1.0; both on the torch
    attention ops so that only the KV dtype differs). Tolerance: a prompt matches when its 32 tokens are identical,
    or when at the first token where they differ the two paths are at a near-tie (both tokens within TIE = 1.0 of
    each other in both paths' logits; after it the texts are different continuations and no longer compared).
    Measured here: identical on 1 of 8; at the first difference of the other 7 the larger of the two gaps was
    0.05-0.56 (6 of 8 would match at TIE = 0.5). Teacher-forced on the fp32-KV tokens, fp8 KV picks the same top-1
    at 239 of 256 positions (bf16 KV: 255, itself identical for 32 tokens on only 7 of 8 prompts: a 0.01 tie).
    e4m3 keeps 3 mantissa bits and this 135M model's greedy path runs through near-ties every few tokens;
    calibrated scales (per layer or per head, amax/448 or a power of two, on these prompts' own K/V) measured
    within noise of 1.0 (240-246 of 256, 1-2 of 8 identical), so the engine computes none."""
    from test_engine_bundled import QUESTIONS
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bundled_model_dir)
    chats = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in QUESTIONS
    ]
    prompts = [list(p["input_ids"]) if not isinstance(p, list) else p for p in chats]
    kw = dict(num_pages=len(prompts) * 16, page_size=16, attention_backend="torch")
    fp32 = ModelRunner(bundled_model_dir, kv_cache_dtype="float32", **kw)
    fp8 = ModelRunner(bundled_model_dir, kv_cache_dtype="fp8_e4m3", **kw)
    ref, ref_logits = _teacher_forced(fp32, prompts, None, TOKENS)
    free, free_logits = _teacher_forced(fp8, prompts, None, TOKENS)
    identical, tie_gaps = 0, []
    for i, p in enumerate(prompts):
        a, b = ref[i][len(p) :], free[i][len(p) :]
        j = _first_divergence(a, b)
        if j == TOKENS:
            identical += 1
            continue
        # the prefixes up to j are the same, so both logits at j are of the same context
        gap_fp32 = float(ref_logits[j, i, a[j]] - ref_logits[j, i, b[j]])
        gap_fp8 = float(free_logits[j, i, b[j]] - free_logits[j, i, a[j]])
        tie_gaps.append(max(gap_fp32, gap_fp8))
    matched = identical + sum(g <= TIE for g in tie_gaps)
    print(f"fp8 KV: {identical} of 8 identical for {TOKENS} tokens, near-tie gaps at the first difference {tie_gaps}")
    assert matched >= 7, f"{matched} of 8 prompts match (identical {identical}, gaps {tie_gaps})"
    _, logits = _teacher_forced(fp8, prompts, ref, TOKENS)
    agree = int((logits.argmax(-1) == ref_logits.argmax(-1)).sum())
    print(f"fp8 KV: top-1 = fp32 KV's at {agree} of {logits.shape[0] * logits.shape[1]} teacher-forced positions")
    assert agree >= 0.9 * logits.shape[0] * logits.shape[1]
    assert "Paris" in tok.decode(free[0][len(prompts[0]) :])


def test_checkpoint_kv_scales_are_read_for_fp8_and_ignored_otherwise(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "scaled"
    shutil.copytree(tiny_llama_dir, d)
    state = load_file(d / "model.safetensors")
    state["model.layers.0.self_attn.k_scale"] = torch.tensor(0.5)
    state["model.layers.0.self_attn.v_scale"] = torch.tensor(0.25)
    state["model.layers.1.self_attn.kv_scale"] = torch.tensor(2.0)  # the older one-scale spelling
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    fp8 = ModelRunner(d, kv_cache_dtype="fp8_e4m3", num_pages=16, page_size=4)
    assert (fp8.kv.k_scales, fp8.kv.v_scales) == ([0.5, 2.0], [0.25, 2.0])
    plain = ModelRunner(d, num_pages=16, page_size=4)  # fp32 KV: the scales are not weights, and not used
    assert plain.kv.k_scales == [1.0, 1.0]
    # the scaled pages give the same next tokens as unscaled fp8 pages (scales only move e4m3's range)
    unscaled = ModelRunner(tiny_llama_dir, kv_cache_dtype="fp8_e4m3", num_pages=16, page_size=4)
    out = SchedulerOutput((ScheduledSeq("a", tuple(range(3, 30)), 0, tuple(range(7)), True),))
    a, b = fp8.forward(out), unscaled.forward(out)
    assert int(a.argmax()) == int(b.argmax()) and (a - b).abs().max() < 0.1 * b.abs().max()
    del state["model.layers.1.self_attn.kv_scale"]
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"leave out layer\(s\) \[1\]"):
        ModelRunner(d, kv_cache_dtype="fp8_e4m3", num_pages=16, page_size=4)
