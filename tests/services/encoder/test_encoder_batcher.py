"""The dynamic batcher without a model: requests arriving together share forwards, grouped by length within the
token budget; results go back to the right request in order; a cancelled request is dropped; a failed forward
fails only its own requests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
import torch

from services.encoder.batcher import EmbedBatcher, plan_batches


def test_plan_batches_groups_by_length_within_budgets() -> None:
    lengths = [5, 100, 6, 7, 90, 3, 300]
    batches = plan_batches(lengths, max_batch_size=3, max_batch_tokens=256)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 256
    assert batches[0] == [5, 0, 2]  # the shortest together
    assert [6] in batches  # over the budget alone: a batch of its own
    assert plan_batches([], 4, 100) == []


class FakeModel:
    """embed(): one row per input = [len, first id]; records each forward's batch and its thread."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[list[list[int]]] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on

    def __call__(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        self.calls.append([list(x) for x in batch])
        self.threads.add(threading.current_thread().name)
        if self.fail_on is not None and any(x[0] == self.fail_on for x in batch):
            raise RuntimeError("boom")
        return torch.tensor([[float(len(x)), float(x[0])] for x in batch])


async def test_concurrent_requests_share_forwards_and_get_their_own_rows() -> None:
    model = FakeModel()
    b = EmbedBatcher(model, max_batch_size=64, max_batch_tokens=4096, wait_s=0.01).start()
    try:
        reqs = [[[i] * (1 + i % 5), [100 + i] * 3] for i in range(20)]
        outs = await asyncio.gather(*(b.submit(r) for r in reqs))
        for r, out in zip(reqs, outs):
            assert out.tolist() == [[float(len(x)), float(x[0])] for x in r]
        assert len(model.calls) < 5  # 40 inputs in a few forwards, not 20
        assert all(t.startswith("encoder-compute") for t in model.threads)
        assert b.queued_inputs == 0 and b.batches == len(model.calls)
    finally:
        await b.close()


async def test_cancelled_request_is_dropped_and_failures_stay_local() -> None:
    model = FakeModel(fail_on=7)
    b = EmbedBatcher(model, max_batch_size=1, max_batch_tokens=4096, wait_s=0.05).start()
    try:
        doomed = asyncio.ensure_future(b.submit([[9, 9]]))
        await asyncio.sleep(0)
        doomed.cancel()
        bad = asyncio.ensure_future(b.submit([[7]]))
        good = asyncio.ensure_future(b.submit([[1, 2]]))
        with pytest.raises(RuntimeError, match="boom"):
            await bad
        assert (await good).tolist() == [[2.0, 1.0]]
        assert all(batch[0][0] != 9 for batch in model.calls)  # never computed
        assert b.queued_inputs == 0
    finally:
        await b.close()
