"""Pages in and out of a tensor-parallel engine whose single KV head both ranks hold (num_kv_heads < tp): an
import gives it to both ranks, an export takes it from rank 0 once, and the bytes come back as they went in; pages
a TP=1 prefill computed continue on the TP=2 engine as on the colocated TP=1 engine.

A module of its own: one process joins one tensor-parallel group at a time, and test_tp_pages.py keeps its engines
for the whole module.
"""

from __future__ import annotations

from pathlib import Path

import torch

from shared.engine.models import load_model_config
from shared.engine.parallel.kv_exchange import HeadSlice, head_slices, sources
from shared.engine.parallel.runner import TPRunner
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tp_handoff import GREEDY, decode, prefill, prompts, tp_engine


def test_a_replicated_kv_head_round_trips_byte_for_byte(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path, "qwen2", heads=4, kv_heads=1)
    slices = head_slices(load_model_config(model), 2)
    assert slices == (HeadSlice(0, 0, 1), HeadSlice(1, 0, 1)) and sources(slices) == (HeadSlice(0, 0, 1),)
    two = tp_engine(model, 2)
    try:
        kv = two.runner.kv
        ids = [3, 9, 4]
        g = torch.Generator().manual_seed(5)
        want = torch.randn((len(ids), *kv.buffer.shape[1:]), generator=g)
        kv.buffer[ids] = want
        two.import_pages(ids)
        kv.buffer[ids] = 0.0  # the export must bring the bytes back from the ranks' pools
        two.export_pages(ids)
        assert torch.equal(kv.buffer[ids], want)
        # rank 1 got its copy of the head too: a TP=2 decode over imported pages continues as TP=1 does
        one = tp_engine(model, 1)
        batch = prompts(3)[:2]
        colocated = [list(c.token_ids) for c in tp_engine(model, 1).generate(batch, GREEDY)]
        for i, p in enumerate(batch):
            first, data = prefill(one, f"r1-{i}", p)
            assert decode(two, f"r2-{i}", p, first, data) == colocated[i]
    finally:
        assert isinstance(two.runner, TPRunner)
        two.runner.close()
