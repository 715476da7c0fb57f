"""Tensor parallelism on CPU (gloo), one process per rank, through the Engine: logits within 1e-4 of transformers
and greedy tokens identical, for tiny random Llama / Qwen2 / Qwen3 checkpoints at TP=2 (KV heads split), a model
whose single KV head is replicated on both ranks and whose vocabulary does not split evenly, and the bundled model
at TP=3 (SmolLM2-135M has 9 attention heads and 3 KV heads: 2 ranks cannot split them, 3 can; see BUNDLED_TOL)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, DeviceConfig, KernelConfig, ModelConfig, ParallelConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.parallel.runner import TPRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import make_tiny_model, tiny_llama_dir, tiny_model_dir  # noqa: F401

PAGE = 4
TOL = 1e-4


def tp_engine(model_dir: Path, tp: int, *, attention: str = "auto", linear: str = "auto") -> Engine:
    return Engine.from_groups(
        model=ModelConfig(model=str(model_dir)),
        cache=CacheConfig(num_pages=96, page_size=PAGE),
        scheduler=SchedulerConfig(max_running_requests=8, chunked_prefill_size=64),
        kernels=KernelConfig(attention_backend=attention, linear_backend=linear),
        device=DeviceConfig(device="cpu", threads=tp),
        parallel=ParallelConfig(tp_size=tp),
    )


def hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def prompts(vocab: int, lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def check_logits(engine: Engine, hf, batch: list[list[int]]) -> float:
    """Prefill `batch` in one step, then two decode steps of every sequence; the worst difference to HF."""
    runner = engine.runner
    free = iter(torch.randperm(runner.num_pages, generator=torch.Generator().manual_seed(3)).tolist())
    pages = [tuple(next(free) for _ in range(-(-(len(p) + 2) // PAGE))) for p in batch]
    worst = 0.0
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages[i], True) for i, p in enumerate(batch))
    for _ in range(3):
        logits = runner.forward_batch(runner.prepare(SchedulerOutput(seqs)))
        assert logits.shape == (len(batch), runner.vocab_size)
        with torch.no_grad():
            for i, p in enumerate(batch):
                ref = hf(torch.tensor([p])).logits[0, -1].float()
                worst = max(worst, (logits[i] - ref).abs().max().item())
        nxt = [int(x) for x in logits.argmax(dim=1)]  # the next step decodes one token of every sequence
        seqs = tuple(ScheduledSeq(f"r{i}", (nxt[i],), len(p), pages[i], True) for i, p in enumerate(batch))
        batch = [p + [nxt[i]] for i, p in enumerate(batch)]
    return worst


def check_greedy(engine: Engine, hf, batch: list[list[int]], n: int = 8) -> None:
    got = engine.generate(batch, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    for p, c in zip(batch, got, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p) :]
        assert list(c.token_ids) == ref.tolist()


def test_tp2_matches_transformers(tiny_model_dir: Path) -> None:
    engine = tp_engine(tiny_model_dir, 2)
    runner = engine.runner
    assert isinstance(runner, TPRunner) and runner.tp_size == 2
    assert runner.inner.layout.num_kv_heads == 1  # 2 KV heads split: one per rank
    assert runner.layout.num_kv_heads == 2  # what hand-offs and the kvstore see: all of them
    assert runner.model.fused_decode is None  # the one-call native decode has no all-reduce
    try:
        hf = hf_model(tiny_model_dir)
        batch = prompts(runner.vocab_size, [1, 5, 13, 30])
        diff = check_logits(engine, hf, batch)
        assert diff <= TOL, f"max abs diff {diff:.2e} > {TOL}"
        check_greedy(engine, hf, batch)
    finally:
        runner.close()


def test_replicated_kv_head_and_uneven_vocab(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path, "qwen2", heads=4, kv_heads=1, vocab=509)
    engine = tp_engine(model, 2, attention="torch", linear="torch")
    runner = engine.runner
    assert isinstance(runner, TPRunner) and runner.inner.layout.num_kv_heads == runner.layout.num_kv_heads == 1
    assert runner.model.embed_tokens.shape[0] == 255  # ceil(509 / 2): rank 0's rows
    try:
        hf = hf_model(model)
        batch = prompts(509, [3, 9, 17])
        diff = check_logits(engine, hf, batch)
        assert diff <= TOL, f"max abs diff {diff:.2e} > {TOL}"
        check_greedy(engine, hf, batch)
    finally:
        runner.close()


# The bundled model at TP=3 with the default CPU kernels: 1.13e-4 from transformers' fp32 logits on these prompts
# (7.1e-5 at TP=1), 8.6e-5 from a float64 run of transformers, whose own fp32 logits are 5.2e-5 from it: the ranks'
# partial sums (K / 3 each, then the all-reduce) round differently from one GEMM over K, by as much as transformers'
# own rounding. With the reference kernels (F.linear: transformers' GEMM) it stays within the 1e-4 contract.
BUNDLED_TOL = {"torch": TOL, "auto": 2e-4}


@pytest.mark.parametrize("kernels", ["torch", "auto"], ids=["reference", "cpu-default"])
def test_bundled_model_tp3(bundled_model_dir, kernels: str) -> None:
    engine = tp_engine(Path(bundled_model_dir), 3, attention=kernels, linear=kernels)
    runner = engine.runner
    try:
        hf = hf_model(Path(bundled_model_dir))
        batch = prompts(runner.vocab_size, [1, 5, 13, 30])
        diff = check_logits(engine, hf, batch)
        assert diff <= BUNDLED_TOL[kernels], f"max abs diff {diff:.2e} > {BUNDLED_TOL[kernels]}"
        check_greedy(engine, hf, batch, n=6)
    finally:
        runner.close()


def test_bad_tp_size_is_one_line(tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"^--tp-size 3 does not divide the model's 4 attention heads"):
        tp_engine(tiny_llama_dir, 3)
