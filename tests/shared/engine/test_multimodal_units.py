"""Multimodal pieces without a model: the encoder cache's LRU budgets, media checks and embedding slices in the
scheduler, and the guard against recomputing images without embeddings."""

from __future__ import annotations

import pytest
import torch

from shared.config.groups import SchedulerConfig
from shared.engine.encoder_cache import EncoderCache
from shared.engine.errors import InvalidRequest
from shared.engine.page_allocator import PageAllocator
from shared.engine.radix_cache import RadixCache
from shared.engine.request import MediaInput
from shared.engine.scheduler import Scheduler
from shared.modelspec.sampling import SamplingParams

P = 4


def emb(rows: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((rows, 8), float(fill), dtype=torch.float32)  # 32 bytes a row


def test_encoder_cache_is_lru_within_items_and_bytes() -> None:
    c = EncoderCache(max_items=3, max_bytes=4 * 32 * 3)
    for i in range(3):
        c.put(f"h{i}", emb(4, i))
    assert len(c) == 3 and c.num_bytes == 3 * 128
    assert c.get("h0") is not None  # h0 is now the most recent
    c.put("h3", emb(4, 3))  # item limit: evicts h1, the least recently used
    assert "h1" not in c and "h0" in c and c.hits == 1
    c.put("big", emb(8, 9))  # 256 bytes: needs two entries out
    assert "big" in c and c.num_bytes <= c.max_bytes and len(c) == 2
    c.put("huge", emb(100))  # larger than the whole budget: not kept, nothing evicted for it
    assert "huge" not in c and "big" in c
    assert c.get("nope") is None and c.misses == 1
    off = EncoderCache(max_items=0)
    off.put("x", emb(1))
    assert len(off) == 0


def make_scheduler() -> Scheduler:
    alloc = PageAllocator(64)
    return Scheduler(
        allocator=alloc,
        cache=RadixCache(alloc, P),
        page_size=P,
        max_model_len=256,
        config=SchedulerConfig(),
        vocab_size=100,
    )


def test_scheduler_checks_media_and_slices_embeddings_per_chunk() -> None:
    s = make_scheduler()
    prompt = list(range(1, 21))
    with pytest.raises(InvalidRequest, match="passes the 20-token prompt"):
        s.add_request("a", prompt, media=[MediaInput(15, 10, "h", emb(10))])
    with pytest.raises(InvalidRequest, match="overlaps"):
        s.add_request("b", prompt, media=[MediaInput(2, 5, "h", emb(5)), MediaInput(4, 3, "g", emb(3))])
    with pytest.raises(InvalidRequest, match="needs embeddings of 5 rows"):
        s.add_request("c", prompt, media=[MediaInput(2, 5, "h", emb(4))])
    s.token_budget = 6  # chunks [0, 6), [6, 12), ...: the image [4, 13) spans three of them
    e = torch.arange(9 * 8, dtype=torch.float32).view(9, 8)
    s.add_request("d", prompt, SamplingParams(max_tokens=1), media=[MediaInput(4, 9, "h", e)])
    got = []
    for _ in range(3):
        out = s.schedule()
        (seq,) = out.seqs
        got.append([(x.offset, x.values[0, 0].item(), x.values.shape[0]) for x in seq.embeds])
        s.update_from_output(out, [7] if seq.need_logits else [])
    assert got == [[(4, 0.0, 2)], [(0, 16.0, 6)], [(0, 64.0, 1)]]


def test_an_image_without_embeddings_is_never_recomputed() -> None:
    s = make_scheduler()
    # what a decode instance holds for a prompt another instance computed: spans and hashes, no embeddings
    req = s.new_request("r", list(range(1, 21)), SamplingParams(max_tokens=2), media=[MediaInput(4, 9, "h")])
    s.requests["r"] = req
    s.waiting.push(req)  # as after a preemption
    out = s.schedule()
    assert not out.seqs and "r" not in s.requests
    (delta,) = s.update_from_output(out, [])
    assert delta.finished and delta.finish_reason == "abort"
