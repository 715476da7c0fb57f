"""All decoder layers of a decode step in one C call (shared/kernels/native/decode_layers.py): the same logits, to
the bit, as the layers one by one, on tiny Llama / Qwen2 (q/k/v bias) / Qwen3 checkpoints and the bundled model, in
fp32 and (where the CPU runs the bf16 kernels) bf16; taken only for pure decode steps within the few-row GEMM's limit,
and only where every kernel is native."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.kernels.native.build import native_available
from tests.helpers.tiny_models import tiny_model_dir  # noqa: F401

pytestmark = pytest.mark.skipif(not native_available()[0], reason="the native kernels do not build here")
PAGE = 4


def _bf16_runs() -> bool:
    from shared.kernels.native.gemm import bf16_kernels

    return native_available()[0] and bf16_kernels()


DTYPES = pytest.mark.parametrize(
    "dtype",
    ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(not _bf16_runs(), reason="no avx512_bf16 here"))],
)


class Counted:
    """The model's fused call, counting the steps it ran."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def run(self, *a):
        self.calls += 1
        return self.inner.run(*a)


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def both_ways(runner: ModelRunner, step: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's logits through the layers one by one, then through the fused call (both write the same K/V into
    the same slots, so the second run sees the cache the first left)."""
    model = runner.model
    fused = model.fused_decode
    model.fused_decode = None
    try:
        plain = runner.forward(step)
    finally:
        model.fused_decode = fused
    return plain, runner.forward(step)


def decode_steps(runner: ModelRunner, prompts: list[list[int]], steps: int, check) -> None:
    """Prefill `prompts` in one step, then `steps` greedy decode steps, each handed to check(step)."""
    pages = [tuple(range(i * 32, i * 32 + 32)) for i in range(len(prompts))]
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages[i], True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    for _ in range(steps):
        for i, p in enumerate(prompts):
            p.append(int(logits[i].argmax()))
        step = SchedulerOutput(
            tuple(ScheduledSeq(f"r{i}", (p[-1],), len(p) - 1, pages[i], True) for i, p in enumerate(prompts))
        )
        logits = check(step)


@DTYPES
def test_fused_decode_is_bit_identical_on_tiny_models(tiny_model_dir: Path, dtype: str) -> None:
    runner = ModelRunner(tiny_model_dir, dtype=dtype, num_pages=256, page_size=PAGE)
    model = runner.model
    if runner.arch.qk_norm:  # Qwen3's q/k norm sits between projection and rotation: the layers run one by one
        assert model.fused_decode is None
        return
    assert model.fused_decode is not None
    counted = Counted(model.fused_decode)
    model.fused_decode = counted
    prompts = [prompt(s, n, runner.vocab_size) for s, n in ((1, 9), (2, 17), (3, 4), (4, 30), (5, 1))]

    def check(step: SchedulerOutput) -> torch.Tensor:
        plain, fused = both_ways(runner, step)
        assert torch.equal(plain, fused)
        return fused

    decode_steps(runner, prompts, 6, check)
    assert counted.calls == 6


@DTYPES
def test_fused_decode_is_bit_identical_on_the_bundled_model(bundled_model_dir: Path, dtype: str) -> None:
    runner = ModelRunner(bundled_model_dir, dtype=dtype, num_pages=16 * 32, page_size=16)
    assert runner.model.fused_decode is not None and runner.model.fused_decode.bf16 == (dtype == "bfloat16")
    prompts = [prompt(10 + i, 20 + 7 * i, runner.vocab_size) for i in range(16)]

    def check(step: SchedulerOutput) -> torch.Tensor:
        plain, fused = both_ways(runner, step)
        assert torch.equal(plain, fused)
        return fused

    decode_steps(runner, prompts, 3, check)


def test_prefill_mixed_and_wide_steps_run_the_layers_one_by_one(tiny_model_dir: Path) -> None:
    runner = ModelRunner(tiny_model_dir, num_pages=512, page_size=PAGE)
    if runner.model.fused_decode is None:
        pytest.skip("no fused decode for this architecture")
    counted = Counted(runner.model.fused_decode)
    runner.model.fused_decode = counted
    vocab = runner.vocab_size
    runner.forward(SchedulerOutput((ScheduledSeq("a", tuple(prompt(1, 8, vocab)), 0, tuple(range(8)), True),)))
    assert counted.calls == 0  # a prefill
    mixed = SchedulerOutput(
        (
            ScheduledSeq("a", (5,), 8, tuple(range(8)), True),
            ScheduledSeq("b", tuple(prompt(2, 6, vocab)), 0, tuple(range(8, 16)), True),
        )
    )
    runner.forward(mixed)
    assert counted.calls == 0  # decode + prefill in one step
    limit = counted.inner.max_rows
    assert limit is not None
    n = limit + 1
    wide = [ScheduledSeq(f"w{i}", (7,), 0, (16 + i,), True) for i in range(n)]
    runner.forward(SchedulerOutput(tuple(wide)))  # n one-token prompts: prefill
    runner.forward(SchedulerOutput(tuple(ScheduledSeq(f"w{i}", (9,), 1, (16 + i,), True) for i in range(n))))
    assert counted.calls == 0  # decode rows past the few-row GEMM's limit
    runner.forward(SchedulerOutput(tuple(ScheduledSeq(f"w{i}", (9,), 2, (16 + i,), True) for i in range(limit))))
    assert counted.calls == 1


def test_other_backends_build_no_fused_call(tiny_model_dir: Path) -> None:
    for attention, linear in (("torch", "torch"), ("native", "onednn")):
        runner = ModelRunner(
            tiny_model_dir, num_pages=16, page_size=PAGE, attention_backend=attention, linear_backend=linear
        )
        assert runner.model.fused_decode is None, (attention, linear)


def test_a_slot_outside_the_cache_is_refused_before_any_write(tiny_model_dir: Path) -> None:
    runner = ModelRunner(tiny_model_dir, num_pages=16, page_size=PAGE)
    fused = runner.model.fused_decode
    if fused is None:
        pytest.skip("no fused decode for this architecture")
    kv = runner.kv
    n = runner.arch.num_layers
    before = [kv.k(i).clone() for i in range(n)]
    hidden = runner.arch.hidden_size
    d = runner.arch.head_dim
    from shared.kernels.attention_plan import FlatDecode

    flat = FlatDecode(
        torch.zeros(1, dtype=torch.int64), torch.zeros((1, 1), dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    )
    fused.bind_caches(kv, [kv.k(i) for i in range(n)], [kv.v(i) for i in range(n)])
    with pytest.raises(IndexError, match="outside the cache"):
        fused.run(
            torch.zeros((1, hidden)),
            torch.zeros((1, hidden)),
            torch.ones((1, 1, d // 2)),
            torch.zeros((1, 1, d // 2)),
            torch.tensor([16], dtype=torch.int64),  # page 16 of 16
            torch.zeros(1, dtype=torch.int64),
            flat,
        )
    assert all(torch.equal(b, kv.k(i)) for i, b in enumerate(before))
