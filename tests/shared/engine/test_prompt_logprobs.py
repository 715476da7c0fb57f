"""Prompt logprobs (echo + logprobs): computed during prefill, equal to log_softmax of HF's logits at each prompt
position (1e-4), across prefill chunks and with the prompt already in the prefix cache; greedy output unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)

PAGE = 16
PROMPT = [(7 * i + 3) % 500 for i in range(37)]


def _hf_logprobs(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # row p predicts token p + 1


@pytest.mark.parametrize("chunk", [0, 10], ids=["one-prefill", "chunked"])
def test_prompt_logprobs_match_hf_and_greedy_is_unchanged(tiny_llama_dir: Path, chunk: int):
    ref = _hf_logprobs(tiny_llama_dir, PROMPT)
    runner = ModelRunner(tiny_llama_dir, num_pages=64, page_size=PAGE)
    engine = Engine(runner, cache=CacheConfig(page_size=PAGE), scheduler=SchedulerConfig(chunked_prefill_size=chunk))
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    asked = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    base = engine.generate([PROMPT], plain, prefix="plain")[0]  # also fills the prefix cache
    for prefix in ("first", "cached"):
        engine.add_request(prefix, PROMPT, asked)
        outs = []
        while engine.has_work():
            outs += [o for o in engine.step() if o.req_id == prefix]
        assert [t for o in outs for t in o.new_token_ids] == list(base.token_ids)
        plps = outs[0].prompt_logprobs
        assert plps is not None and all(o.prompt_logprobs is None for o in outs[1:])
        assert [p.token_id for p in plps] == PROMPT[1:]
        got = torch.tensor([p.logprob for p in plps])
        want = ref[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        for p, row in zip(plps, ref, strict=False):
            v, ix = row.topk(3)
            assert [t for t, _ in p.top] == ix.tolist()
            torch.testing.assert_close(torch.tensor([x for _, x in p.top]), v, atol=1e-4, rtol=0)
        assert outs[-1].num_cached_tokens == 0  # the prefix cache was skipped for this prompt
