"""Rank 0 of a tensor-parallel instance: the Runner the engine schedules for. It starts the other ranks, and each
step broadcasts the batch to them before it computes its own shard of it (follower.py says why a broadcast).

Each rank's KV pool holds its own KV heads of the same pages: rank 0's scheduler hands out page ids and every rank
writes the same pages of its pool, so the prefix cache and the page allocator stay on rank 0 alone. What leaves or
enters the instance (a hand-off, the kvstore) goes through `kv`, a full-head pool of the same page ids on rank 0's
host, in the layout a tp-1 instance has (kv_exchange.py says why): export_pages / import_pages move pages between
it and the ranks' pools.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch

from shared.engine.errors import RankLost
from shared.engine.forward_batch import ForwardBatch
from shared.engine.kv_pool import KVPool
from shared.engine.model_runner import ModelRunner, arch_tp_problem
from shared.engine.models import load_model_config
from shared.engine.parallel import batch_wire
from shared.engine.parallel.group import START_TIMEOUT_S, GroupAddress, join, leave, serve_store
from shared.engine.parallel.kv_exchange import KVExchange, full_layout, head_slices
from shared.engine.parallel.ranks import RankArgs, RankProcesses
from shared.engine.parallel.shard import ShardSpec, rank_shard
from shared.engine.types import SchedulerOutput

# A collective inside a step waits this long for a peer before the step fails (a hung rank fails loudly).
COLLECTIVE_TIMEOUT_S = 120.0
# Loading a shard may take minutes on a large model.
LOAD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class TPOptions:
    """Rank 0's ModelRunner arguments that the followers repeat, and the group's size, devices and threads."""

    tp_size: int
    model_dir: str
    dtype: str
    device: str  # "cpu", or rank 0's "cuda[:N]"
    follower_devices: tuple[str, ...]  # ranks 1..tp-1: "cpu" each, or their "cuda:N"
    threads: int  # per rank
    num_pages: int | None
    kv_budget_bytes: int | None
    page_size: int
    attention_backend: str
    linear_backend: str
    max_batch_tokens: int
    context_length: int | None
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S
    load_timeout_s: float = LOAD_TIMEOUT_S


class TPRunner:
    """The Runner contract (shared/engine/runner.py) over rank 0's ModelRunner and the follower ranks.

    can_copy_pages is False: a page copy (n > 1 forks) would have to reach every rank's pool; forks prefill their
    partial last page instead (what a runner without copies does)."""

    can_copy_pages = False
    llava = None  # vision-language models are refused at tp > 1

    def __init__(
        self, inner: ModelRunner, ranks: RankProcesses, control: torch.distributed.ProcessGroup, timeout_s: float
    ) -> None:
        self.inner, self.ranks, self.control = inner, ranks, control
        self.timeout = timedelta(seconds=timeout_s)
        self.tp_size = len(ranks.args) + 1
        self.num_pages, self.vocab_size, self.eos_token_ids = inner.num_pages, inner.vocab_size, inner.eos_token_ids
        self.context_length, self.device = inner.context_length, inner.device
        # The pages hand-offs and the kvstore read and write: all KV heads, on rank 0's host (registered with a
        # transfer engine as host memory on any device). Backed once a transfer engine is attached (prefill, decode, a
        # worker using the kvstore: KVTransfer populates it); a worker without one never touches it.
        self.layout = full_layout(inner.layout, inner.arch)
        self.kv = KVPool(self.layout, inner.num_pages, "cpu")
        self.exchange = KVExchange(self.kv, inner.kv, head_slices(inner.arch, self.tp_size), control, self.timeout)
        self.model_dir, self.model, self.attn, self.linear = inner.model_dir, inner.model, inner.attn, inner.linear
        self.max_batch_tokens: int | None = inner.max_batch_tokens
        self._closed = False
        atexit.register(self.close)

    def prepare(self, out: SchedulerOutput) -> ForwardBatch:
        return self.inner.prepare(out)

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        """Broadcast the batch, compute rank 0's shard (its collectives meet the other ranks'), return the logits."""
        if self._closed:
            raise RankLost("the tensor-parallel ranks were stopped")
        self.ranks.check()
        try:
            batch_wire.send_batch(batch, self.control, self.timeout)
            return self.inner.forward_batch(batch)
        except RuntimeError as e:  # gloo/nccl: a peer closed its connection or a collective timed out
            why = self.ranks.dead() or "a tensor-parallel collective failed"
            raise RankLost(f"{why}: {e}") from e

    def export_pages(self, page_ids: Sequence[int]) -> None:
        """`kv`'s pages `page_ids` := every rank's KV heads of them (before a hand-off or a store reads them)."""
        self._exchange("export", lambda: self.exchange.export(page_ids))

    def import_pages(self, page_ids: Sequence[int]) -> None:
        """Every rank's pool's pages `page_ids` := its heads of `kv`'s (after a hand-off or a load wrote them)."""
        self._exchange("import", lambda: self.exchange.import_(page_ids))

    def _exchange(self, what: str, run: Callable[[], None]) -> None:
        if self._closed:
            raise RankLost("the tensor-parallel ranks were stopped")
        self.ranks.check()
        try:
            run()
        except RuntimeError as e:  # as in forward_batch: a rank is gone or hangs
            why = self.ranks.dead() or f"the {what} of KV pages failed"
            raise RankLost(f"{why}: {e}") from e

    def close(self) -> None:
        """Stop the follower ranks (they exit after the stop command) and leave the group."""
        if self._closed:
            return
        self._closed = True
        if self.ranks.dead() is None:
            try:
                batch_wire.send_stop(self.control, self.timeout)
            except RuntimeError:
                pass  # a rank is gone: stop() kills what is left
        self.ranks.stop()
        leave()


def start_tp_runner(o: TPOptions) -> TPRunner:
    """Start ranks 1..tp-1, join the group as rank 0, load rank 0's shard and wait for the others'. A model that
    does not split over tp_size ranks is refused (ValueError) before any process starts."""
    arch = load_model_config(o.model_dir)
    problem = arch_tp_problem(arch, o.tp_size)
    if problem is not None:
        raise ValueError(problem)
    ShardSpec.for_rank(arch, o.tp_size, 0)
    backend = "nccl" if o.device.startswith("cuda") else "gloo"
    store = serve_store(o.tp_size, START_TIMEOUT_S)
    addr = GroupAddress(store.port, o.tp_size, backend, o.collective_timeout_s)
    args = [
        RankArgs(
            rank=r,
            size=o.tp_size,
            port=addr.port,
            backend=backend,
            timeout_s=o.collective_timeout_s,
            threads=o.threads,
            model_dir=o.model_dir,
            dtype=o.dtype,
            device=o.follower_devices[r - 1],
            num_pages=o.num_pages,
            kv_budget_bytes=o.kv_budget_bytes,
            page_size=o.page_size,
            attention_backend=o.attention_backend,
            linear_backend=o.linear_backend,
            max_batch_tokens=o.max_batch_tokens,
            context_length=o.context_length,
        )
        for r in range(1, o.tp_size)
    ]
    ranks = RankProcesses(args)
    try:
        joined = join(addr, 0, store)
        inner = ModelRunner(
            o.model_dir,
            dtype=o.dtype,
            device=o.device,
            num_pages=o.num_pages,
            kv_budget_bytes=o.kv_budget_bytes,
            page_size=o.page_size,
            attention_backend=o.attention_backend,
            linear_backend=o.linear_backend,
            max_batch_tokens=o.max_batch_tokens,
            context_length=o.context_length,
            shard=rank_shard(arch, joined.handle),
        )
        ranks.wait_ready(store, o.load_timeout_s)
    except BaseException:
        for p in ranks.procs:
            p.kill()
        ranks.stop()
        leave()
        raise
    return TPRunner(inner, ranks, joined.control, o.collective_timeout_s)
