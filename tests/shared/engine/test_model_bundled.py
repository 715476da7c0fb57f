"""HF parity on the bundled SmolLM2-135M-Instruct (30 layers, GQA 9/3, tied embeddings): a mixed batch, a chunked
prompt with a prefix hit, then batched decode steps, each compared with transformers' logits (fp32, <= 1e-4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput

pytestmark = pytest.mark.slow
PAGE = 16
TOL = 1e-4


@pytest.fixture(scope="module")
def pair(bundled_model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(bundled_model_dir)
    return hf, tok, ModelRunner(bundled_model_dir, num_pages=64, page_size=PAGE)


def hf_last(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert not ours.isnan().any()
    diff = (ours - ref).abs().max().item()
    assert diff <= TOL, f"max abs diff {diff:.2e} > {TOL}"


def test_bundled_model_matches_transformers(pair) -> None:
    hf, tok, runner = pair
    assert runner.arch.num_layers == 30 and runner.arch.tie_word_embeddings and runner.vocab_size == 49152
    assert tok.convert_tokens_to_ids("<|im_end|>") in runner.eos_token_ids
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    texts = [tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False), "Paris is", "1, 2, 3, 4, 5,"]
    prompts = [tok(t).input_ids for t in texts]
    free = list(range(runner.num_pages))[::-1]
    pages = {}
    seqs = []
    for i, p in enumerate(prompts):
        pages[i] = tuple(free.pop() for _ in range(-(-(len(p) + 8) // PAGE)))
        seqs.append(ScheduledSeq(f"r{i}", tuple(p), 0, pages[i], True))
    logits = runner.forward(SchedulerOutput(tuple(seqs)))
    for i, p in enumerate(prompts):
        close(logits[i], hf_last(hf, p))
    # greedy decode, batched, checked at every step
    n_prompt = len(prompts[0])
    for _ in range(7):
        for i, p in enumerate(prompts):
            p.append(int(logits[i].argmax()))
        step = SchedulerOutput(
            tuple(ScheduledSeq(f"r{i}", (p[-1],), len(p) - 1, pages[i], True) for i, p in enumerate(prompts))
        )
        logits = runner.forward(step)
        for i, p in enumerate(prompts):
            close(logits[i], hf_last(hf, p))
    prompts[0].append(int(logits[0].argmax()))
    assert "Paris" in tok.decode(prompts[0][n_prompt:])  # "The capital of France is Paris."


def test_bundled_chunked_prefill_after_prefix_hit(pair) -> None:
    hf, tok, runner = pair
    base = tok("The quick brown fox jumps over the lazy dog. " * 4).input_ids
    assert len(base) > 2 * PAGE
    first = tuple(range(40, 40 + -(-len(base) // PAGE)))
    runner.forward(SchedulerOutput((ScheduledSeq("a", tuple(base), 0, first, False),)))
    other = base[: 2 * PAGE] + tok(" Then it sleeps under a tree until the evening comes.").input_ids
    pages = first[:2] + tuple(range(50, 50 + -(-len(other) // PAGE) - 2))
    mid = 2 * PAGE + 5
    runner.forward(SchedulerOutput((ScheduledSeq("b", tuple(other[2 * PAGE : mid]), 2 * PAGE, pages, False),)))
    logits = runner.forward(SchedulerOutput((ScheduledSeq("b", tuple(other[mid:]), mid, pages, True),)))
    close(logits[0], hf_last(hf, other))
