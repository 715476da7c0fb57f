"""CUDA-graph decode runner. On CPU: batch-size bookkeeping, and the static-buffer path (use_graphs=False re-runs
the step over the static buffers instead of replaying a graph) against eager decode steps of a tiny model with the
Triton backend under the interpreter: padding to the nearest captured size, rows a larger batch left behind,
eager fallback past the largest size, K/V writes landing on the real pages and padding only on the scratch page.
On a GPU (`gpu`): real capture and replay equal eager steps, in fp32 and bf16."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from shared.engine.cuda_graph import CudaGraphDecodeRunner, build_decode_graphs, capture_order, padded_batch_size
from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.kernels.dispatch import TorchAttentionBackend
from tests.helpers.tiny_models import make_tiny_model

PAGE = 4
NUM_PAGES = 48
SCRATCH = NUM_PAGES - 1  # the CPU tests never hand this page to a sequence


def test_capture_order_and_padding() -> None:
    assert capture_order([4, 1, 2, 2, 16, 8]) == (16, 8, 4, 2, 1)
    sizes = capture_order([1, 2, 4, 8])
    assert [padded_batch_size(b, sizes) for b in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    for bad in ([], [0, 2]):
        with pytest.raises(ValueError, match="cuda_graph_bs"):
            capture_order(bad)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("graph-model"), "llama")


@pytest.fixture(scope="module")
def runner(tiny_dir: Path) -> ModelRunner:
    return ModelRunner(tiny_dir, num_pages=NUM_PAGES, page_size=PAGE, attention_backend="triton", context_length=64)


def test_cpu_runner_builds_no_graphs(tiny_dir: Path) -> None:
    r = ModelRunner(tiny_dir, num_pages=8, page_size=PAGE, cuda_graph_bs=(1, 2))
    assert r.graphs is None and r.kv.buffer.shape[0] == 8  # CPU behaviour unchanged: no extra page either


def test_graphs_need_a_capturable_backend_and_cuda(runner: ModelRunner, caplog: pytest.LogCaptureFixture) -> None:
    torch_attn = TorchAttentionBackend()
    with pytest.raises(ValueError, match="--attention-backend triton"):
        CudaGraphDecodeRunner(
            runner.model,
            runner.kv,
            torch_attn,
            batch_sizes=(1,),
            max_pages_per_seq=16,
            page_size=PAGE,
            scratch_page=SCRATCH,
            use_graphs=False,
        )
    with caplog.at_level(logging.WARNING):
        assert (
            build_decode_graphs(
                runner.model,
                runner.kv,
                torch_attn,
                batch_sizes=(1,),
                context_length=64,
                page_size=PAGE,
                scratch_page=SCRATCH,
            )
            is None
        )
    assert "decode CUDA graphs are off" in caplog.text
    with pytest.raises(ValueError, match="cuda device"):
        CudaGraphDecodeRunner(
            runner.model,
            runner.kv,
            runner.attn,
            batch_sizes=(1,),
            max_pages_per_seq=16,
            page_size=PAGE,
            scratch_page=SCRATCH,
        )
    with pytest.raises(ValueError, match="scratch_page"):
        CudaGraphDecodeRunner(
            runner.model,
            runner.kv,
            runner.attn,
            batch_sizes=(1,),
            max_pages_per_seq=16,
            page_size=PAGE,
            scratch_page=NUM_PAGES,
            use_graphs=False,
        )


class Seqs:
    """Sequences prefilled eagerly, each with pages for 12 more tokens, decoded a step at a time."""

    def __init__(self, runner: ModelRunner, lens: list[int], seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        free = torch.randperm(runner.num_pages, generator=g).tolist()
        free.remove(SCRATCH)  # never handed to a sequence (the CPU tests use it as the padding page)
        self.tokens: list[list[int]] = []
        self.pages: list[tuple[int, ...]] = []
        for n in lens:
            need = -(-(n + 12) // PAGE)
            self.pages.append(tuple(free[:need]))
            free = free[need:]
            self.tokens.append(torch.randint(3, runner.vocab_size, (n,), generator=g).tolist())
        out = SchedulerOutput(
            tuple(ScheduledSeq(f"s{i}", tuple(t), 0, self.pages[i], True) for i, t in enumerate(self.tokens))
        )
        for i, row in enumerate(runner.forward(out)):
            self.tokens[i].append(int(row.argmax()))

    def decode(self, rows: list[int]) -> SchedulerOutput:
        return SchedulerOutput(
            tuple(
                ScheduledSeq(f"s{i}", (self.tokens[i][-1],), len(self.tokens[i]) - 1, self.pages[i], True) for i in rows
            )
        )


def test_static_buffers_match_eager_steps(runner: ModelRunner) -> None:
    graphs = CudaGraphDecodeRunner(
        runner.model,
        runner.kv,
        runner.attn,
        batch_sizes=(4, 1, 2),
        max_pages_per_seq=64 // PAGE,
        page_size=PAGE,
        scratch_page=SCRATCH,
        use_graphs=False,
    )
    graphs.capture()
    seqs = Seqs(runner, [3, 9, 16, 1, 22, 6], seed=3)
    kv = runner.kv.buffer
    # padded 3 -> 4, exact 1, a full 4, then 2 after it (rows 2-3 must go back to padding), eager 5, padded 3
    for rows in ([0, 2, 4], [5], [1, 3, 0, 2], [4, 5], [0, 1, 2, 3, 4], [5, 1, 3]):
        batch = runner.prepare(seqs.decode(rows))
        before = kv.clone()
        eager = runner.forward_batch(batch)
        after_eager = kv.clone()
        if len(rows) > graphs.max_bs:
            assert not graphs.can_run(batch)
        else:
            kv.copy_(before)
            replays = graphs.replays
            assert graphs.can_run(batch)
            got = graphs.run(batch)
            assert graphs.replays == replays + 1
            assert got.shape == eager.shape and not got.isnan().any()
            torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
            # rows past the batch are padding, even those a larger batch used before: a stale row would rewrite
            # a page that may belong to another sequence by now
            n = len(rows)
            assert (graphs.out_pages[n:] == SCRATCH).all() and (graphs.page_table[n:, 0] == SCRATCH).all()
            assert (graphs.seq_lens[n:] == 1).all() and (graphs.positions[n:] == 0).all()
            # every real page holds what the eager step wrote; padding only ever touched the scratch page
            torch.testing.assert_close(kv[:SCRATCH], after_eager[:SCRATCH], rtol=1e-6, atol=1e-6)
        for i, row in zip(rows, eager):
            seqs.tokens[i].append(int(row.argmax()))


def test_prefill_and_partial_logits_steps_are_not_captured(runner: ModelRunner) -> None:
    graphs = CudaGraphDecodeRunner(
        runner.model,
        runner.kv,
        runner.attn,
        batch_sizes=(2,),
        max_pages_per_seq=4,
        page_size=PAGE,
        scratch_page=SCRATCH,
        use_graphs=False,
    )
    prefill = runner.prepare(SchedulerOutput((ScheduledSeq("p", (5, 6, 7), 0, (0,), True),)))
    one = runner.prepare(SchedulerOutput((ScheduledSeq("d", (5,), 3, (0,), True),)))
    no_logits = runner.prepare(SchedulerOutput((ScheduledSeq("d", (5,), 3, (0,), False),)))
    too_long = runner.prepare(SchedulerOutput((ScheduledSeq("d", (5,), 20, tuple(range(6)), True),)))
    assert not graphs.can_run(one)  # nothing captured yet
    graphs.capture()
    assert graphs.can_run(one)
    assert not graphs.can_run(prefill) and not graphs.can_run(no_logits) and not graphs.can_run(too_long)


# ---- real capture -------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 1e-1)])  # logits ~ +-3
def test_gpu_replay_equals_eager(tiny_dir: Path, dtype: str, tol: float) -> None:
    kw = dict(
        dtype=dtype, device="cuda", num_pages=NUM_PAGES, page_size=PAGE, attention_backend="triton", context_length=64
    )
    eager = ModelRunner(tiny_dir, **kw)
    graphed = ModelRunner(tiny_dir, cuda_graph_bs=(1, 2, 4), **kw)
    assert eager.graphs is None and graphed.graphs is not None
    assert graphed.kv.buffer.shape[0] == NUM_PAGES + 1  # the scratch page for padding rows
    a, b = Seqs(eager, [3, 9, 16, 1, 22, 6], seed=4), Seqs(graphed, [3, 9, 16, 1, 22, 6], seed=4)
    assert a.tokens == b.tokens
    for rows in ([0, 2, 4], [5], [1, 3, 0, 2], [4, 5], [0, 1, 2, 3, 4], [5, 1, 3]):
        replays = graphed.graphs.replays
        want = eager.forward(a.decode(rows))
        got = graphed.forward(b.decode(rows))
        assert graphed.graphs.replays == replays + (len(rows) <= 4)  # 5 rows: past the largest graph, eager
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=0, atol=tol)
        for i, row in zip(rows, want):
            a.tokens[i].append(int(row.argmax()))
            b.tokens[i].append(int(row.argmax()))
    graphed.graphs.close()
