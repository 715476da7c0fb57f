"""Joining a tensor-parallel group: a TCPStore on 127.0.0.1 (rank 0 is its server), one torch.distributed group
for the model's collectives (gloo on cpu, nccl on cuda) and a gloo group for the step broadcast.

Two groups because they wait differently. The model's collectives run inside a step, where every rank is busy: they
time out after `timeout_s`, so a rank that hangs or died fails rank 0's step loudly instead of blocking it forever.
The broadcast of the next step is what an idle instance waits on (for minutes, for hours): its group waits as long as
it takes; a rank 0 that dies closes its sockets (and kills its children: follower.py), which ends that wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from shared.engine.parallel.comm import GroupHandle

LOCALHOST = "127.0.0.1"
# The step broadcast's wait (an idle instance). gloo takes a finite timeout: a year is "as long as it takes".
IDLE_WAIT = timedelta(days=365)
# Joining the group: a rank's interpreter starts and imports torch first.
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class GroupAddress:
    """Where the ranks of one instance meet and how they talk."""

    port: int
    size: int
    backend: str  # "gloo" (cpu) or "nccl" (cuda)
    timeout_s: float  # of a collective inside a step
    start_timeout_s: float = START_TIMEOUT_S


@dataclass(frozen=True)
class Joined:
    """A rank's groups: `handle` for the model's collectives, `control` for the step broadcast, `store` for the
    start handshake."""

    handle: GroupHandle
    control: dist.ProcessGroup
    store: dist.TCPStore


def serve_store(size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's store on a free port of 127.0.0.1 (port 0: the OS picks one; store.port says which)."""
    return dist.TCPStore(
        LOCALHOST, 0, size, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def join(addr: GroupAddress, rank: int, store: dist.TCPStore | None = None) -> Joined:
    """Join the group as `rank` (rank 0 passes the store it serves). Blocks until every rank has joined.

    The default group only gathers the ranks (its timeout is the start's); the model's collectives get a group
    of their own with the step timeout."""
    start = timedelta(seconds=addr.start_timeout_s)
    if store is None:
        store = dist.TCPStore(LOCALHOST, addr.port, addr.size, is_master=False, timeout=start)
    dist.init_process_group(addr.backend, store=store, rank=rank, world_size=addr.size, timeout=start)
    model = dist.new_group(backend=addr.backend, timeout=timedelta(seconds=addr.timeout_s))
    control = dist.new_group(backend="gloo", timeout=IDLE_WAIT)
    assert model is not None and control is not None
    return Joined(GroupHandle(rank, addr.size, model), control, store)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
