"""Rank 0 starts ranks 1..tp-1 as child processes (`python -m shared.engine.parallel.follower`), each told what to
load by one typed JSON argument, and watches them: a rank that exits is reported by name, never waited on.

Subprocesses of a small entry point rather than multiprocessing's spawn: the child imports only the engine (not the
service that started rank 0), and its argument is a declared dataclass rather than a pickled object.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import torch.distributed as dist

from shared.engine.errors import RankLost


@dataclass(frozen=True)
class RankArgs:
    """What a follower rank loads and where it joins (the same model arguments as rank 0's ModelRunner)."""

    rank: int
    size: int
    port: int
    backend: str
    timeout_s: float
    threads: int
    model_dir: str
    dtype: str
    device: str
    num_pages: int | None
    kv_budget_bytes: int | None
    page_size: int
    attention_backend: str
    linear_backend: str
    max_batch_tokens: int
    context_length: int | None

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, text: str) -> RankArgs:
        return cls(**json.loads(text))


def ready_key(rank: int) -> str:
    return f"ready/{rank}"


class RankProcesses:
    """The follower ranks of one instance, as child processes of rank 0."""

    def __init__(self, args: list[RankArgs]) -> None:
        self.args = args
        self.procs = [
            subprocess.Popen([sys.executable, "-m", "shared.engine.parallel.follower", a.encode()]) for a in args
        ]

    def dead(self) -> str | None:
        """A line naming the first rank that has exited, or None while all run (a waitpid per rank: cheap)."""
        for a, p in zip(self.args, self.procs, strict=True):
            rc = p.poll()
            if rc is not None:
                return f"tensor-parallel rank {a.rank} of {a.size} (pid {p.pid}) exited with code {rc}"
        return None

    def check(self) -> None:
        why = self.dead()
        if why is not None:
            raise RankLost(f"{why}; this instance cannot compute without it")

    def wait_ready(self, store: dist.TCPStore, timeout_s: float) -> None:
        """Until every follower has loaded its shard (its ready key in the store); RankLost when one exits first
        or the time runs out (naming the ranks still loading)."""
        deadline = time.monotonic() + timeout_s
        waiting = [a.rank for a in self.args]
        while waiting:
            self.check()
            waiting = [r for r in waiting if not store.check([ready_key(r)])]
            if waiting and time.monotonic() > deadline:
                raise RankLost(f"tensor-parallel rank(s) {waiting} did not load their shard within {timeout_s:.0f} s")
            if waiting:
                time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wait for the followers to exit (after the stop command), killing those that do not."""
        for p in self.procs:
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
