"""A fake model runner that checks the scheduler's page bookkeeping, and tests of the fake itself.

Its "KV cache" stores token ids: forward() writes each scheduled token into the slot (page, offset) the scheduler
gave for its position, then reads the whole context back from the pages. The next token is a hash of that
context, so any page mix-up (a wrong prefix-cache hit, a page freed and reused too early, a missed chunk) changes
the output, and tests compare against `reference_greedy`, which hashes the true token sequence.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from shared.engine.runner import OneCallStep
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.kv_layout import KVLayout

VOCAB = 97


def next_token(context: list[int] | np.ndarray, vocab: int = VOCAB) -> int:
    data = np.asarray(context, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % vocab


def reference_greedy(prompt: list[int], n: int, vocab: int = VOCAB, eos: tuple[int, ...] = ()) -> list[int]:
    seq = list(prompt)
    out: list[int] = []
    for _ in range(n):
        t = next_token(seq, vocab)
        out.append(t)
        seq.append(t)
        if t in eos:
            break
    return out


class FakeRunner(OneCallStep):
    def __init__(
        self,
        num_pages: int,
        page_size: int = 4,
        *,
        vocab_size: int = VOCAB,
        context_length: int = 4096,
        eos_token_ids: tuple[int, ...] = (),
        fail_on_token: int | None = None,
    ) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.eos_token_ids = eos_token_ids
        self.layout = KVLayout("float32", page_size, 1, 1, 1)
        self.kv = np.full((num_pages, page_size), -1, dtype=np.int64)  # [page, slot] -> token id
        self.fail_on_token = fail_on_token
        self.steps: list[SchedulerOutput] = []
        self.max_batch_tokens: int | None = None
        self.can_copy_pages = False  # its "pool" is a token table: n > 1 forks prefill from the prefix cache

    def _check(self, s: ScheduledSeq) -> None:
        end = s.start_pos + len(s.token_ids)
        assert len(s.page_ids) == -(-end // self.page_size), f"{s.req_id}: {len(s.page_ids)} pages for {end} tokens"
        assert len(set(s.page_ids)) == len(s.page_ids), f"{s.req_id}: a page appears twice"

    def forward(self, out: SchedulerOutput) -> torch.Tensor:
        self.steps.append(out)
        P = self.page_size
        rows = []
        owners: dict[int, str] = {}
        for s in out.seqs:
            self._check(s)
            for i in range((s.start_pos) // P, len(s.page_ids)):  # pages written this step belong to one seq
                prev = owners.setdefault(s.page_ids[i], s.req_id)
                assert prev == s.req_id, f"page {s.page_ids[i]} written by {prev} and {s.req_id} in one step"
            if self.fail_on_token is not None and self.fail_on_token in s.token_ids:
                raise RuntimeError("injected device failure")
            for j, t in enumerate(s.token_ids):
                pos = s.start_pos + j
                self.kv[s.page_ids[pos // P], pos % P] = t
            if s.need_logits:
                end = s.start_pos + len(s.token_ids)
                ctx = self.kv[list(s.page_ids)].reshape(-1)[:end]
                assert (ctx >= 0).all(), f"{s.req_id}: attends over KV never written"
                row = torch.zeros(self.vocab_size)
                row[next_token(ctx, self.vocab_size)] = 1.0
                rows.append(row)
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)


def test_fake_runner_reads_what_it_wrote_across_chunks():
    r = FakeRunner(8, page_size=4)
    prompt = [5, 6, 7, 8, 9, 10]
    r.forward(SchedulerOutput((ScheduledSeq("a", tuple(prompt[:4]), 0, (3,), False),)))
    logits = r.forward(SchedulerOutput((ScheduledSeq("a", tuple(prompt[4:]), 4, (3, 1), True),)))
    assert int(logits.argmax()) == reference_greedy(prompt, 1)[0]


def test_fake_runner_detects_wrong_pages():
    r = FakeRunner(8, page_size=4)
    r.forward(SchedulerOutput((ScheduledSeq("a", (1, 2, 3, 4), 0, (0,), False),)))
    r.forward(SchedulerOutput((ScheduledSeq("b", (9, 9, 9, 9), 0, (2,), False),)))
    # "c" claims a cached prefix [1, 2, 3, 4] but is handed page 2, which holds b's tokens
    logits = r.forward(SchedulerOutput((ScheduledSeq("c", (5,), 4, (2, 5), True),)))
    assert int(logits.argmax()) != reference_greedy([1, 2, 3, 4, 5], 1)[0] or next_token([9, 9, 9, 9, 5]) == next_token(
        [1, 2, 3, 4, 5]
    )
    with pytest.raises(AssertionError, match="never written"):
        r.forward(SchedulerOutput((ScheduledSeq("d", (5,), 4, (6, 7), True),)))
