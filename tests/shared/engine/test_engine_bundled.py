"""The bundled SmolLM2-135M through the engine: greedy output identical to HF generate for 8 chat prompts x 64
tokens in one continuous batch (chunked prefill, a shared system prompt), also after forced preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Explain what a CPU does in one sentence.",
    "Say hello in Spanish.",
    "What is 12 times 12?",
    "Give me a tip for sleeping better.",
]


@pytest.fixture(scope="module")
def setup(bundled_model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(bundled_model_dir)
    prompts = [
        tok.apply_chat_template(
            [{"role": "system", "content": "You are a helpful, concise assistant."}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
        )
        for q in QUESTIONS
    ]
    prompts = [list(p["input_ids"]) if not isinstance(p, list) else p for p in prompts]
    hf = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # ignore_eos: a GenerationConfig argument cannot unset it
    cfg = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=0)
    ref = []
    with torch.no_grad():
        for p in prompts:
            ref.append(hf.generate(torch.tensor([p]), generation_config=cfg)[0, len(p) :].tolist())
    return tok, prompts, ref


@pytest.mark.parametrize("num_pages", [512, 36], ids=["roomy", "preempting"])
def test_bundled_model_matches_hf_generate(setup, bundled_model_dir: Path, num_pages: int):
    tok, prompts, ref = setup
    runner = ModelRunner(bundled_model_dir, num_pages=num_pages, page_size=16)
    engine = Engine(
        runner,
        cache=CacheConfig(page_size=16),
        scheduler=SchedulerConfig(
            max_running_requests=8,
            chunked_prefill_size=64,
            max_prefill_tokens=64,
            new_token_ratio=0.0 if num_pages < 512 else 0.4,
        ),
        tokenizer=tok,
    )
    got = engine.generate(prompts, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    for i, c in enumerate(got):
        assert list(c.token_ids) == ref[i], f"{QUESTIONS[i]!r}: {c.text!r} vs {tok.decode(ref[i])!r}"
    s = engine.stats
    assert s.num_cached_prompt_tokens > 0  # the shared system prompt was reused
    assert (s.num_preemptions > 0) == (num_pages < 512)
    assert "Paris" in got[0].text
