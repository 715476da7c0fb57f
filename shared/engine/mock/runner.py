"""MockRunner: the model runner's contract without a model. The engine around it is the real one (scheduler,
page allocator, radix cache, sampler), so are the services (hand-off, KV events, load reports); only the forward
pass is replaced by a sleep as long as the real engine's step would take (shared/engine/mock/timing.py).

The KV pool is real but tiny (one layer, one head of two values: the token id and its position), so hand-offs
move real bytes that checksums verify, and dozens of mock instances fit in a few hundred MB. Logits cover a small
band of ordinary token ids only: the next token is a function of the last one and its position, never an EOS,
so a request runs to its max_tokens (or a stop string) as a benchmark expects, and greedy output is deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from shared.engine.kv_pool import KVPool
from shared.engine.mock.timing import TimingTable
from shared.engine.runner import OneCallStep
from shared.engine.types import SchedulerOutput
from shared.modelspec.kv_layout import KVLayout

# Generated ids come from [TOKEN_LOW, TOKEN_LOW + TOKEN_SPAN): ordinary BPE pieces in the bundled vocabulary,
# away from the special tokens at the start of it.
TOKEN_LOW, TOKEN_SPAN = 300, 512


def next_token(last: int, position: int) -> int:
    """What the mock 'model' predicts after `last` at `position` (the tests' ground truth)."""
    return TOKEN_LOW + (last * 31 + position * 7) % TOKEN_SPAN


class MockRunner(OneCallStep):
    """Runner protocol (shared/engine/runner.py) over a TimingTable. `speedup` > 1 compresses time (a 30-minute
    simulated run in 10 minutes with 3); `sleep` is injectable for tests."""

    def __init__(
        self,
        table: TimingTable,
        *,
        page_size: int = 16,
        num_pages: int | None = None,
        context_length: int | None = None,
        max_batch_tokens: int = 4096,
        speedup: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if speedup <= 0:
            raise ValueError(f"--mock-speedup must be > 0 (got {speedup}); try 1")
        self.table = table
        self.vocab_size = table.vocab_size
        self.eos_token_ids = tuple(table.eos_token_ids)
        self.context_length = context_length or table.context_length
        self.page_size = page_size
        self.max_batch_tokens = max_batch_tokens
        self.speedup = speedup
        self._sleep = sleep
        self.layout = KVLayout(dtype="float32", page_size=page_size, num_layers=1, num_kv_heads=1, head_dim=2)
        self.num_pages = num_pages or table.num_pages
        self.kv = KVPool(self.layout, self.num_pages)
        self.can_copy_pages = True
        self.device = torch.device("cpu")
        self.modelled_s = 0.0  # total step time the model asked for (tests compare it with the wall clock)

    def step_time_s(self, out: SchedulerOutput) -> float:
        prefill = batch = context = 0
        for s in out.seqs:
            n = len(s.token_ids)
            if n == 1 and s.start_pos > 0 and s.need_logits:
                batch += 1
                context += s.start_pos + 1
            else:
                prefill += n
        return self.table.step_s(prefill, batch, context) / self.speedup

    def forward(self, out: SchedulerOutput) -> torch.Tensor:
        """Write the step's KV, wait the modelled step time, return logits [seqs with need_logits, band]."""
        t0 = time.perf_counter()
        if not out.seqs:
            return torch.empty((0, TOKEN_LOW + TOKEN_SPAN), dtype=torch.float32)
        if out.num_tokens > self.max_batch_tokens:
            raise ValueError(f"step has {out.num_tokens} tokens, more than max_batch_tokens {self.max_batch_tokens}")
        self._write_kv(out)
        wanted = [s for s in out.seqs if s.need_logits]
        logits = torch.full((len(wanted), TOKEN_LOW + TOKEN_SPAN), -1e4, dtype=torch.float32)
        for row, s in enumerate(wanted):
            pos = s.start_pos + len(s.token_ids)
            logits[row, next_token(s.token_ids[-1], pos)] = 0.0
        want = self.step_time_s(out)
        self.modelled_s += want
        left = want - (time.perf_counter() - t0)
        if left > 0:
            self._sleep(left)
        return logits

    def _write_kv(self, out: SchedulerOutput) -> None:
        P = self.page_size
        pages: list[int] = []
        offsets: list[int] = []
        values: list[tuple[float, float]] = []
        for s in out.seqs:
            for i, tok in enumerate(s.token_ids):
                pos = s.start_pos + i
                pages.append(s.page_ids[pos // P])
                offsets.append(pos % P)
                values.append((float(tok), float(pos)))
        kv = torch.tensor(values, dtype=torch.float32).view(-1, 1, 2)  # [T, kv_heads=1, head_dim=2]
        self.kv.write(0, torch.tensor(pages), torch.tensor(offsets), kv, kv)
