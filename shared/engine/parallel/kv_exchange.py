"""Pages in and out of a tensor-parallel instance: a hand-off (prefill -> decode) or a kvstore transfer moves pages
in ONE layout whatever the TP size, the full-head layout a --tp-size 1 instance's pool has:

    page: [num_layers, 2 (K, V), page_size, num_kv_heads (all of them), head_dim]

Rank 0 keeps a host pool of that layout with the same page ids as the ranks' pools (the "mirror", runner.kv at
tp > 1), and only it is registered with the transfer engine. Before pages leave (a prefill's hand-off, a kvstore
save) rank 0 gathers every rank's KV heads of them into the mirror (`export`); after pages arrive in the mirror (a
decode's hand-off, a kvstore load) it scatters each rank's heads of them into that rank's pool (`import_`), before
the request's next step reads them. Replicated KV heads (num_kv_heads < tp: several ranks hold the same head) are
taken from the first rank holding each one; every holder gets them back on import.

Why this layout first: the ticket (its layout, its page descriptors), the transfer engines (NIXL, Mooncake), the
checksums (over the full-head bytes: a hand-off stays byte-exact) and the kvstore's keys do not change at all, a
prefill of any TP size hands off to a decode of any TP size, and the kvstore needs a TP-independent layout anyway
(what one instance stored, an instance of another TP size loads). The cost: the pages cross the gloo group once
more than they would rank to rank, and rank 0's host holds the mirror (the bytes of one tp-1 pool, made resident
once a transfer engine is attached to it). Per-rank transfer endpoints, each rank's slice moving from its prefill rank to
the decode rank(s) owning those heads without rank 0's staging (descriptors per rank pair, checksums per slice), is
the GPU step that follows: it saves the copies through host memory, which on CPU cost no more than the transfer.

Every tensor crosses the group as bytes (uint8 views), so any pool dtype travels the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from shared.engine.kv_pool import KVPool
from shared.engine.models.config import ModelArchConfig
from shared.engine.parallel import batch_wire
from shared.engine.parallel.batch_wire import Command, PageCommand
from shared.engine.parallel.shard import ShardSpec
from shared.modelspec.kv_layout import KVLayout


@dataclass(frozen=True)
class HeadSlice:
    """Rank `rank`'s KV heads: full heads [start, start + count) of the model, its pool's heads [0, count)."""

    rank: int
    start: int
    count: int


def head_slices(arch: ModelArchConfig, tp_size: int) -> tuple[HeadSlice, ...]:
    """Every rank's KV heads, rank order (ValueError naming the numbers when the model does not split)."""
    specs = [ShardSpec.for_rank(arch, tp_size, r) for r in range(tp_size)]
    return tuple(HeadSlice(s.rank, s.kv_head_start, s.kv_heads) for s in specs)


def sources(slices: Sequence[HeadSlice]) -> tuple[HeadSlice, ...]:
    """The slices an export takes: each full head from the first rank holding it (replicated heads once)."""
    seen: set[int] = set()
    out = []
    for s in slices:
        if s.start not in seen:
            seen.add(s.start)
            out.append(s)
    return tuple(out)


def full_layout(local: KVLayout, arch: ModelArchConfig) -> KVLayout:
    """The TP-independent layout of a rank's pool layout: all of the model's KV heads."""
    return KVLayout(
        dtype=local.dtype,
        page_size=local.page_size,
        num_layers=local.num_layers,
        num_kv_heads=arch.num_kv_heads,
        head_dim=local.head_dim,
    )


def _bytes(pool: KVPool) -> torch.Tensor:
    """[num_pages, layers, 2, page_size, heads, head_dim x element size] uint8 view of the pool (no copy)."""
    return pool.buffer.view(torch.uint8)


def _wait(work: dist.Work | None, timeout: timedelta | None, what: str) -> None:
    assert work is not None
    if timeout is None:
        work.wait()
    elif not work.wait(timeout):
        raise RuntimeError(f"the {what} of KV pages timed out after {timeout.total_seconds():.0f} s")


# Pages are copied one by one (a page is ~1 MiB: the loop costs nothing next to the bytes): index_select /
# index_copy_ / indexed assignment over uint8 pages ran at 0.1-0.4 GB/s here, a copy_ per page at ~3 GB/s.


def local_pages(pool: KVPool, ids: torch.Tensor) -> torch.Tensor:
    """A rank's pages `ids`, all its heads, as contiguous bytes on the cpu (what the group moves)."""
    src = _bytes(pool)
    out = torch.empty((ids.numel(), *src.shape[1:]), dtype=torch.uint8)
    for i, p in enumerate(ids.tolist()):
        out[i].copy_(src[p])
    return out


def store_local(pool: KVPool, ids: torch.Tensor, data: torch.Tensor) -> None:
    """Write [n, ...] page bytes of this rank's heads into the pool's pages `ids`."""
    dst = _bytes(pool)
    for i, p in enumerate(ids.tolist()):
        dst[p].copy_(data[i])


class KVExchange:
    """Rank 0's side: export (gather into the mirror) and import (scatter from it), over the control group, the
    followers told by a page command on the step broadcast first. Runs on the engine thread, between steps: the
    control group carries one thing at a time."""

    def __init__(
        self,
        mirror: KVPool,
        local: KVPool,
        slices: Sequence[HeadSlice],
        group: dist.ProcessGroup,
        timeout: timedelta,
    ) -> None:
        self.mirror, self.local, self.slices, self.group, self.timeout = mirror, local, tuple(slices), group, timeout
        self._sources = sources(slices)

    def _ids(self, page_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.as_tensor(list(page_ids), dtype=torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.mirror.num_pages):
            raise ValueError(f"page ids must be in [0, {self.mirror.num_pages}); got {list(page_ids)}")
        return ids

    def export(self, page_ids: Sequence[int]) -> None:
        """The mirror's pages `page_ids` := every rank's heads of them (the full-head bytes a tp-1 pool holds)."""
        ids = self._ids(page_ids)
        if not ids.numel():
            return
        batch_wire.send_pages(Command.GATHER_PAGES, ids, self.group, self.timeout)
        mine = local_pages(self.local, ids)  # [n, layers, 2, page_size, local heads, head bytes]
        parts = [torch.empty_like(mine) for _ in self.slices]
        _wait(dist.gather(mine, parts, dst=0, group=self.group, async_op=True), self.timeout, "gather")
        full = _bytes(self.mirror)
        for s in self._sources:
            for i, p in enumerate(ids.tolist()):
                full[p, :, :, :, s.start : s.start + s.count].copy_(parts[s.rank][i])

    def import_(self, page_ids: Sequence[int]) -> None:
        """Every rank's pool's pages `page_ids` := its heads of the mirror's (what a peer wrote there)."""
        ids = self._ids(page_ids)
        if not ids.numel():
            return
        batch_wire.send_pages(Command.SCATTER_PAGES, ids, self.group, self.timeout)
        full = _bytes(self.mirror)  # [num_pages, layers, 2, page_size, all heads, head bytes]
        parts = [
            torch.empty((ids.numel(), *full.shape[1:4], s.count, full.shape[5]), dtype=torch.uint8) for s in self.slices
        ]
        for s, part in zip(self.slices, parts, strict=True):
            for i, p in enumerate(ids.tolist()):
                part[i].copy_(full[p, :, :, :, s.start : s.start + s.count])
        mine = torch.empty_like(parts[0])
        _wait(dist.scatter(mine, parts, src=0, group=self.group, async_op=True), self.timeout, "scatter")
        store_local(self.local, ids, mine)


def serve(cmd: PageCommand, pool: KVPool, group: dist.ProcessGroup) -> None:
    """A follower's side of a page command: send rank 0 its heads of the pages, or store what rank 0 sends."""
    ids = cmd.page_ids
    if cmd.command == Command.GATHER_PAGES:
        _wait(dist.gather(local_pages(pool, ids), None, dst=0, group=group, async_op=True), None, "gather")
        return
    assert cmd.command == Command.SCATTER_PAGES, cmd.command
    shape = (ids.numel(), *_bytes(pool).shape[1:])
    mine = torch.empty(shape, dtype=torch.uint8)
    _wait(dist.scatter(mine, None, src=0, group=group, async_op=True), None, "scatter")
    store_local(pool, ids, mine)
