"""ForwardBatch construction (positions, slots, page table, logits rows) and the runner's guards and attributes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.engine.forward_batch import build_forward_batch
from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401


def test_forward_batch_flattens_sequences() -> None:
    seqs = (
        ScheduledSeq("a", (5, 6, 7), 0, (9, 2), True),  # prefill of 3 tokens
        ScheduledSeq("b", (8,), 6, (4, 1, 0), True),  # decode at position 6 -> page 1 of its list, offset 2
        ScheduledSeq("c", (1, 2, 3, 4, 5), 3, (7, 3, 6), False),  # chunk at positions 3..7
    )
    b = build_forward_batch(SchedulerOutput(seqs), page_size=4)
    # reference built token by token, the slow obvious way
    ids, pos, pages, offs = [], [], [], []
    for s in seqs:
        for j, tok in enumerate(s.token_ids):
            p = s.start_pos + j
            ids.append(tok), pos.append(p), pages.append(s.page_ids[p // 4]), offs.append(p % 4)
    assert b.input_ids.tolist() == ids and b.positions.tolist() == pos
    assert b.out_pages.tolist() == pages and b.out_offsets.tolist() == offs
    assert b.page_table.tolist() == [[9, 0], [4, 1], [7, 3]]  # pages the tokens reach, padded with 0
    assert b.logits_indices.tolist() == [2, 3]  # last token of a and of b; c asked for none
    assert b.prefix_lens.tolist() == [0, 6, 3] and b.extend_lens.tolist() == [3, 1, 5]
    assert b.token_starts.tolist() == [0, 3, 4] and b.seq_lens.tolist() == [3, 7, 8]
    assert not b.is_decode and b.num_tokens == 9 and b.batch_size == 3
    for t in (b.input_ids, b.positions, b.page_table, b.out_pages, b.out_offsets, b.logits_indices):
        assert t.dtype == torch.int64


@pytest.mark.parametrize(
    "seq,kwargs,match",
    [
        (ScheduledSeq("x", (1, 2, 3, 4, 5), 0, (0,), True), {}, "needs 2 pages"),
        (ScheduledSeq("x", (), 0, (0,), True), {}, "no tokens"),
        (ScheduledSeq("x", (1,), 0, (99,), True), {"num_pages": 10}, "outside the KV pool"),
        (ScheduledSeq("x", (1, 700), 0, (0,), True), {"vocab_size": 512}, "token id 700"),
        (ScheduledSeq("x", (1,), 40, tuple(range(11)), True), {"max_positions": 32}, "context length 32"),
    ],
)
def test_forward_batch_rejects_bad_steps(seq: ScheduledSeq, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_forward_batch(SchedulerOutput((seq,)), page_size=4, **kwargs)


def test_runner_attributes(tiny_llama_dir: Path) -> None:
    r = ModelRunner(tiny_llama_dir, kv_budget_bytes=1 << 20, page_size=8)
    assert r.layout.num_layers == 2 and r.layout.num_kv_heads == 2 and r.layout.head_dim == 16
    assert r.layout.page_size == 8 and r.layout.dtype == "float32"
    assert r.num_pages == (1 << 20) // r.layout.page_bytes == r.kv.num_pages
    assert r.vocab_size == 512 and r.context_length == 512
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert r.eos_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    assert r.hf_config.model_type == "llama"


def test_runner_guards(tiny_llama_dir: Path) -> None:
    r = ModelRunner(tiny_llama_dir, num_pages=8, page_size=4, max_batch_tokens=16)
    assert r.forward(SchedulerOutput()).shape == (0, 512)
    too_many = SchedulerOutput((ScheduledSeq("x", tuple(range(3, 20)), 0, tuple(range(5)), True),))
    with pytest.raises(ValueError, match="max_batch_tokens 16"):
        r.forward(too_many)
    with pytest.raises(ValueError, match="power of two"):
        ModelRunner(tiny_llama_dir, num_pages=8, page_size=12)
    with pytest.raises(ValueError, match="not both"):
        ModelRunner(tiny_llama_dir, num_pages=8, kv_budget_bytes=1 << 20)
    with pytest.raises(ValueError, match="no config.json"):
        ModelRunner(tiny_llama_dir / "nope")


def test_forward_writes_kv_only_into_the_given_pages(tiny_llama_dir: Path) -> None:
    r = ModelRunner(tiny_llama_dir, num_pages=8, page_size=4)
    r.forward(SchedulerOutput((ScheduledSeq("x", (5, 6, 7, 8, 9), 0, (6, 2), True),)))
    touched = (r.kv.buffer != 0).flatten(1).any(1)
    assert touched.nonzero().flatten().tolist() == [2, 6]
    assert (r.kv.buffer[2, :, :, 1:] == 0).all()  # token 4 sits at offset 0 of page 2; the rest is untouched
