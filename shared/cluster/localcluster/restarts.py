"""Restart policy of the `pdrelay up` supervisor: what crashed comes back, with exponential backoff.

Compose (`restart: unless-stopped`) and Kubernetes restart crashed containers; the local cluster does the same for
its children (services, etcd, nats-server) once the cluster was ready: a child that exits without being asked to
(not drained, not stopping) is started again with the same command line (services: the same instance id, a new
epoch; etcd / NATS: the same port and data directory). The delay doubles with every crash in a row, from
`initial_s` up to `max_s`; a child that stayed up for `stable_s` starts again from `initial_s`. `pdrelay up
--no-restart` turns it off (a crash is then only reported).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    enabled: bool = True
    initial_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0


@dataclass
class _Record:
    restarts: int = 0  # over the cluster's life
    in_a_row: int = 0  # crashes without a stable run in between
    started_at: float | None = None


@dataclass
class Restarts:
    """Restart counts and backoff per child name (instance id, "etcd", "nats")."""

    policy: RestartPolicy = RestartPolicy()
    clock: Callable[[], float] = time.monotonic
    _records: dict[str, _Record] = field(default_factory=dict)

    def started(self, name: str) -> None:
        self._records.setdefault(name, _Record()).started_at = self.clock()

    def crashed(self, name: str) -> float:
        """`name` exited unexpectedly: the delay before starting it again (and it counts as a restart)."""
        r = self._records.setdefault(name, _Record())
        if r.started_at is not None and self.clock() - r.started_at >= self.policy.stable_s:
            r.in_a_row = 0
        delay = min(self.policy.max_s, self.policy.initial_s * (2**r.in_a_row))
        r.in_a_row += 1
        r.restarts += 1
        return delay

    def count(self, name: str) -> int:
        r = self._records.get(name)
        return r.restarts if r is not None else 0
