"""Logits of our runner vs Hugging Face transformers (fp32, max abs diff <= 1e-4) on tiny random Llama, Qwen2 and
Qwen3 checkpoints: a mixed-length batch in one forward, chunked prefill, prefix hits (shared and copied pages),
decode steps, and decode mixed with prefill in one step; with the reference and the default CPU kernels. HF
recomputes each full sequence without a cache, so it is an independent reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from tests.helpers.tiny_models import tiny_model_dir  # noqa: F401

PAGE = 4
TOL = 1e-4


class Pages:
    """Hands out page ids in a scrambled order, so contiguity is never assumed."""

    def __init__(self, n: int) -> None:
        self.free = torch.randperm(n, generator=torch.Generator().manual_seed(5)).tolist()

    def take(self, n: int) -> tuple[int, ...]:
        got, self.free = self.free[:n], self.free[n:]
        assert len(got) == n
        return tuple(got)


@pytest.fixture(
    scope="module",
    params=[("torch", "torch"), ("native", "native"), ("native", "onednn")],
    ids=["reference", "cpu-default", "cpu-onednn"],
)
def pair(request, tiny_model_dir: Path):
    """(attention, linear) backends: the torch reference ops with F.linear (transformers' own GEMM), the CPU
    default (C decode attention, the native few-row GEMM over oneDNN) and oneDNN alone."""
    from transformers import AutoModelForCausalLM

    attention, linear = request.param
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    runner = ModelRunner(
        tiny_model_dir, num_pages=128, page_size=PAGE, attention_backend=attention, linear_backend=linear
    )
    assert (runner.attn.name, runner.linear.name) == request.param
    return hf, runner


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab] logits of HF on the whole sequence."""
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


def test_mixed_lengths_in_one_forward(pair) -> None:
    hf, runner = pair
    pages = Pages(runner.num_pages)
    prompts = [prompt(i, n, runner.vocab_size) for i, n in enumerate([1, 5, 8, 13, 30])]
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages.take(npages(len(p))), True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    assert logits.shape == (5, runner.vocab_size) and logits.dtype == torch.float32
    for i, p in enumerate(prompts):
        assert_close(logits[i], hf_logits(hf, p)[-1])


def test_chunked_prefill_reuses_pages(pair) -> None:
    hf, runner = pair
    pages = Pages(runner.num_pages)
    p = prompt(11, 23, runner.vocab_size)
    ref = hf_logits(hf, p)
    ids = pages.take(npages(len(p)))
    start = 0
    for n in (6, 9, 8):  # chunk ends at 6, 15, 23: none page-aligned
        end = start + n
        seq = ScheduledSeq("c", tuple(p[start:end]), start, ids[: npages(end)], need_logits=True)
        logits = runner.forward(SchedulerOutput((seq,)))
        assert_close(logits[0], ref[end - 1])
        start = end
    # a non-final chunk that does not ask for logits returns no row
    seq = ScheduledSeq("c2", tuple(p[:6]), 0, pages.take(2), need_logits=False)
    assert runner.forward(SchedulerOutput((seq,))).shape == (0, runner.vocab_size)


@pytest.mark.parametrize("copy_pages", [False, True])
def test_prefix_hit(pair, copy_pages: bool) -> None:
    hf, runner = pair
    pages = Pages(runner.num_pages)
    a = prompt(21, 14, runner.vocab_size)
    b = a[:8] + prompt(22, 7, runner.vocab_size)  # shares two full pages with a
    a_pages = pages.take(npages(len(a)))
    runner.forward(SchedulerOutput((ScheduledSeq("a", tuple(a), 0, a_pages, True),)))
    shared = a_pages[:2]
    if copy_pages:  # what a transfer or a kvstore load does: same bytes, other page ids
        shared = pages.take(2)
        for src, dst in zip(a_pages[:2], shared):
            runner.kv.page_view(dst).copy_(runner.kv.page_view(src))
    b_pages = shared + pages.take(npages(len(b)) - 2)
    logits = runner.forward(SchedulerOutput((ScheduledSeq("b", tuple(b[8:]), 8, b_pages, True),)))
    assert_close(logits[0], hf_logits(hf, b)[-1])


def test_decode_steps_match_every_position(pair) -> None:
    hf, runner = pair
    pages = Pages(runner.num_pages)
    seqs = {f"d{i}": prompt(30 + i, n, runner.vocab_size) for i, n in enumerate([3, 9, 16])}
    room = {r: pages.take(npages(len(p) + 8)) for r, p in seqs.items()}  # headroom for the decoded tokens
    out = SchedulerOutput(tuple(ScheduledSeq(r, tuple(p), 0, room[r], True) for r, p in seqs.items()))
    logits = runner.forward(out)
    for step in range(6):
        for i, (r, p) in enumerate(seqs.items()):
            assert_close(logits[i], hf_logits(hf, p)[-1])
            p.append(int(logits[i].argmax()))
        out = SchedulerOutput(tuple(ScheduledSeq(r, (p[-1],), len(p) - 1, room[r], True) for r, p in seqs.items()))
        assert out.is_decode_only
        logits = runner.forward(out)


def test_decode_and_prefill_in_one_step(pair) -> None:
    hf, runner = pair
    pages = Pages(runner.num_pages)
    a = prompt(41, 10, runner.vocab_size)
    a_pages = pages.take(4)
    first = runner.forward(SchedulerOutput((ScheduledSeq("a", tuple(a), 0, a_pages, True),)))
    a.append(int(first[0].argmax()))
    b, c = prompt(42, 7, runner.vocab_size), prompt(43, 12, runner.vocab_size)
    out = SchedulerOutput(
        (
            ScheduledSeq("b", tuple(b), 0, pages.take(2), True),
            ScheduledSeq("a", (a[-1],), len(a) - 1, a_pages, True),
            ScheduledSeq("c", tuple(c[:5]), 0, pages.take(3), False),  # first chunk of c: no logits
        )
    )
    logits = runner.forward(out)
    assert logits.shape[0] == 2
    assert_close(logits[0], hf_logits(hf, b)[-1])
    assert_close(logits[1], hf_logits(hf, a)[-1])


def test_bfloat16_runs_and_tracks_float32(tiny_model_dir: Path) -> None:
    r32 = ModelRunner(tiny_model_dir, num_pages=16, page_size=PAGE)
    r16 = ModelRunner(tiny_model_dir, dtype="bfloat16", num_pages=16, page_size=PAGE)
    assert r16.kv.buffer.dtype == torch.bfloat16 and r16.layout.dtype == "bfloat16"
    p = prompt(51, 12, r32.vocab_size)
    out = SchedulerOutput((ScheduledSeq("x", tuple(p), 0, (0, 1, 2), True),))
    l32, l16 = r32.forward(out), r16.forward(out)
    assert l16.dtype == torch.float32 and not l16.isnan().any()
    # bf16 keeps ~3 significant digits; random tiny weights give logits of magnitude ~2
    assert (l16 - l32).abs().max().item() < 0.15
