"""Rank 0 -> the other ranks: each step's ForwardBatch, as two gloo broadcasts of int64 tensors (a fixed header,
then every field packed in one tensor), and between steps the page commands of a hand-off or a kvstore transfer
(gather or scatter these pages' KV heads: kv_exchange.py). No pickle: the fields and their order are declared here.

The attention metadata is not sent: every rank derives it from the batch with the same pure function
(AttentionBackend.prepare), which costs less than a third broadcast and cannot differ between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum

import numpy as np
import torch
import torch.distributed as dist

from shared.engine.forward_batch import ForwardBatch

_HEADER = 8


class Command(IntEnum):
    FORWARD = 1
    STOP = 2
    GATHER_PAGES = 3  # every rank sends rank 0 its KV heads of the pages (an export: kv_exchange.py)
    SCATTER_PAGES = 4  # rank 0 sends every rank its KV heads of the pages (an import)


@dataclass(frozen=True)
class PageCommand:
    """A page command as a follower receives it: which one, and the page ids ([n] int64, on the cpu)."""

    command: Command
    page_ids: torch.Tensor


def _broadcast(t: torch.Tensor, group: dist.ProcessGroup, timeout: timedelta | None = None) -> None:
    """timeout: rank 0's (a rank that hangs must not block the step: gloo's send waits for the receiver); the
    followers wait without one (an idle instance sends nothing for as long as it is idle)."""
    work = dist.broadcast(t, src=0, group=group, async_op=True)
    assert work is not None
    if timeout is None:
        work.wait()
    elif not work.wait(timeout):
        raise RuntimeError(f"the step broadcast timed out after {timeout.total_seconds():.0f} s")


def send_batch(batch: ForwardBatch, group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Rank 0: the batch every rank computes this step (multimodal rows are not supported at tp > 1)."""
    if batch.embed_rows is not None:
        raise ValueError("image inputs are not supported at --tp-size > 1")
    bs, max_pages = batch.page_table.shape
    header = [Command.FORWARD, batch.num_tokens, bs, max_pages, batch.logits_indices.numel(), batch.page_size]
    header += [batch.num_prompt_rows, 0]
    cpu = [t.reshape(-1).cpu() for t in (batch.input_ids, batch.positions, batch.out_pages, batch.out_offsets)]
    cpu += [batch.logits_indices.cpu(), batch.page_table.reshape(-1).cpu()]
    cpu += [torch.from_numpy(a.astype(np.int64)) for a in (batch.prefix_lens, batch.extend_lens, batch.token_starts)]
    _broadcast(torch.tensor(header, dtype=torch.int64), group, timeout)
    _broadcast(torch.cat(cpu), group, timeout)


def send_stop(group: dist.ProcessGroup, timeout: timedelta) -> None:
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0] = Command.STOP
    _broadcast(header, group, timeout)


def send_pages(command: Command, page_ids: torch.Tensor, group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Rank 0: tell every rank to take part in a gather or a scatter of these pages ([n] int64), which follows."""
    assert command in (Command.GATHER_PAGES, Command.SCATTER_PAGES), command
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0], header[1] = command, page_ids.numel()
    _broadcast(header, group, timeout)
    _broadcast(page_ids.to(torch.int64).cpu().contiguous(), group, timeout)


def receive(group: dist.ProcessGroup, device: torch.device) -> ForwardBatch | PageCommand | None:
    """The other ranks: the next step's batch (on `device`), a page command, or None when rank 0 stops."""
    header = torch.empty(_HEADER, dtype=torch.int64)
    _broadcast(header, group)
    cmd, t, bs, max_pages, n, page_size, prompt_rows, _ = (int(v) for v in header)
    if cmd == Command.STOP:
        return None
    if cmd in (Command.GATHER_PAGES, Command.SCATTER_PAGES):
        ids = torch.empty(t, dtype=torch.int64)
        _broadcast(ids, group)
        return PageCommand(Command(cmd), ids)
    assert cmd == Command.FORWARD, cmd
    sizes = [t, t, t, t, n, bs * max_pages, bs, bs, bs]
    flat = torch.empty(sum(sizes), dtype=torch.int64)
    _broadcast(flat, group)
    ids, pos, pages, offsets, logits, table, prefix, extend, starts = torch.split(flat, sizes)
    on = [x.to(device) for x in (ids, pos, pages, offsets, logits)]
    return ForwardBatch(
        input_ids=on[0],
        positions=on[1],
        page_table=table.reshape(bs, max_pages).to(device),
        out_pages=on[2],
        out_offsets=on[3],
        logits_indices=on[4],
        prefix_lens=prefix.numpy().copy(),
        extend_lens=extend.numpy().copy(),
        token_starts=starts.numpy().copy(),
        page_size=page_size,
        num_prompt_rows=prompt_rows,
    )
