"""Engine parity with `--attention-backend triton`: our runner's logits equal Hugging Face's (fp32, max abs diff
<= 1e-4) with the Triton attention kernels running under the interpreter, on tiny two-layer random Llama and Qwen3
checkpoints (Qwen3: head_dim 32, q/k norm). Same scenarios as tests/shared/engine/test_model_parity.py: mixed
prompt lengths in one forward (extend kernel), chunked prefill over unaligned chunks, a prefix hit on copied pages,
decode steps (decode kernel), decode mixed with prefill in one step. The norms, rotary embedding and SiLU-and-mul
run on their Triton kernels too (they come with the attention backend). HF recomputes each full sequence without a
cache, so it is an independent reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.kernels.triton.backend import TritonAttentionBackend
from tests.helpers.tiny_models import make_tiny_model

PAGE = 4
TOL = 1e-4


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    model_dir: Path = make_tiny_model(tmp_path_factory.mktemp("tiny-2layer"), request.param, layers=2)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    runner = ModelRunner(model_dir, num_pages=64, page_size=PAGE, attention_backend="triton")
    assert isinstance(runner.attn, TritonAttentionBackend)
    assert runner.model.ops.name == "triton" and runner.model.layers[0].ops.name == "triton"  # norms, rotary, act
    return hf, runner


class Pages:
    """Hands out page ids in a scrambled order, so contiguity is never assumed."""

    def __init__(self, n: int, seed: int) -> None:
        self.free = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()

    def take(self, n: int) -> tuple[int, ...]:
        got, self.free = self.free[:n], self.free[n:]
        assert len(got) == n
        return tuple(got)


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def npages(n: int) -> int:
    return -(-n // PAGE)


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert not ours.isnan().any()
    diff = (ours - ref).abs().max().item()
    assert diff <= TOL, f"max abs diff {diff:.2e} > {TOL}"


def test_prefill_chunks_and_prefix_hit(pair) -> None:
    hf, runner = pair
    pages = Pages(runner.num_pages, 1)
    prompts = [prompt(i, n, runner.vocab_size) for i, n in enumerate([1, 6, 13, 37])]  # 37: two query blocks
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages.take(npages(len(p))), True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    for i, p in enumerate(prompts):
        assert_close(logits[i], hf_logits(hf, p)[-1])

    p = prompts[3]
    ids = pages.take(npages(len(p)))
    for start, end in ((0, 6), (6, 15)):  # unaligned chunks over the pages of an earlier chunk
        seq = ScheduledSeq("c", tuple(p[start:end]), start, ids[: npages(end)], need_logits=True)
        assert_close(runner.forward(SchedulerOutput((seq,)))[0], hf_logits(hf, p[:end])[-1])

    # a prefix hit on copied pages (what a KV transfer does): two full pages of prompt 3, then 5 new tokens
    b = p[:8] + prompt(99, 5, runner.vocab_size)
    shared = pages.take(2)
    for src, dst in zip(seqs[3].page_ids[:2], shared):
        runner.kv.page_view(dst).copy_(runner.kv.page_view(src))
    seq = ScheduledSeq("b", tuple(b[8:]), 8, shared + pages.take(npages(len(b)) - 2), True)
    assert_close(runner.forward(SchedulerOutput((seq,)))[0], hf_logits(hf, b)[-1])


def test_decode_steps_and_a_mixed_step(pair) -> None:
    hf, runner = pair
    pages = Pages(runner.num_pages, 2)
    seqs = {f"d{i}": prompt(30 + i, n, runner.vocab_size) for i, n in enumerate([3, 9, 16])}
    room = {r: pages.take(npages(len(p) + 4)) for r, p in seqs.items()}  # headroom for the decoded tokens
    logits = runner.forward(
        SchedulerOutput(tuple(ScheduledSeq(r, tuple(p), 0, room[r], True) for r, p in seqs.items()))
    )
    for _ in range(3):
        for i, (r, p) in enumerate(seqs.items()):
            assert_close(logits[i], hf_logits(hf, p)[-1])
            p.append(int(logits[i].argmax()))
        out = SchedulerOutput(tuple(ScheduledSeq(r, (p[-1],), len(p) - 1, room[r], True) for r, p in seqs.items()))
        assert out.is_decode_only
        logits = runner.forward(out)
    for i, p in enumerate(seqs.values()):
        assert_close(logits[i], hf_logits(hf, p)[-1])

    # a decode token, a new prompt and a first chunk without logits in one step: one extend launch
    a = seqs["d0"]
    a.append(int(logits[0].argmax()))
    b, c = prompt(42, 7, runner.vocab_size), prompt(43, 12, runner.vocab_size)
    out = SchedulerOutput(
        (
            ScheduledSeq("b", tuple(b), 0, pages.take(2), True),
            ScheduledSeq("d0", (a[-1],), len(a) - 1, room["d0"], True),
            ScheduledSeq("c", tuple(c[:5]), 0, pages.take(3), False),
        )
    )
    logits = runner.forward(out)
    assert logits.shape[0] == 2
    assert_close(logits[0], hf_logits(hf, b)[-1])
    assert_close(logits[1], hf_logits(hf, a)[-1])
