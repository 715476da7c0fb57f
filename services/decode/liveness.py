"""Liveness of the prefills a decode is waiting on, separate from the hand-off's compute deadline.

A hand-off's deadline follows the prompt and the prefill rate decode measured (prefill_choice.py); on a slow box that
deadline is long, and a prefill that stops answering (SIGSTOP, a partition, a wedged process) would hold every
request in flight on it that long. Two short signals detect it in seconds whatever the rate:

    health     while any hand-off to a prefill is in flight, one probe loop per address asks its grpc.health.v1
               service every `interval_s`; `misses` probes in a row (back to back after the first) without an answer (each `timeout_s`) mark it
               dead, and every hand-off waiting on it fails over at once
    computed   the prefill sends initial metadata `shared.serving.handoff.COMPUTED_KEY` once the prompt is computed; from then on only the
               page write and the checksum remain, which get their own short deadline (remote_prefill.py), so a
               prefill that hangs after computing is given up on quickly too
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.pdrelay.v1 import common_pb2
from shared.serving.decode_servicer import HandoffFailed

log = logging.getLogger(__name__)


class PrefillSilent(HandoffFailed):
    """A hand-off given up on because its prefill stopped answering health probes."""

    def __init__(self, message: str) -> None:
        super().__init__(message, common_pb2.ERROR_CODE_TIMEOUT)


@dataclass
class _Watch:
    dead: asyncio.Event = field(default_factory=asyncio.Event)
    users: int = 0
    task: asyncio.Task[None] | None = None


class PeerWatch:
    def __init__(
        self,
        channel_for: Callable[[str], grpc.aio.Channel],
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.5,
        misses: int = 2,
    ) -> None:
        self._channel_for = channel_for
        self.interval_s, self.timeout_s, self.misses = interval_s, timeout_s, misses
        self._watches: dict[str, _Watch] = {}
        self.found_dead = 0  # prefills marked dead by missed probes (metrics and tests)

    @contextlib.asynccontextmanager
    async def watching(self, address: str) -> AsyncIterator[asyncio.Event]:
        """While inside, `address` is probed; the event is set once it missed `misses` probes in a row."""
        w = self._watches.get(address)
        if w is None or w.dead.is_set():
            w = self._watches[address] = _Watch()
            w.task = asyncio.create_task(self._probe(address, w))
        w.users += 1
        try:
            yield w.dead
        finally:
            w.users -= 1
            if not w.users:
                if w.task is not None:
                    w.task.cancel()
                if self._watches.get(address) is w:
                    del self._watches[address]

    async def _probe(self, address: str, w: _Watch) -> None:
        stub = health_pb2_grpc.HealthStub(self._channel_for(address))
        missed = 0
        while True:
            if not missed:  # after a miss, ask again at once: silence is confirmed within `misses` timeouts
                await asyncio.sleep(self.interval_s)
            try:
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout_s)
                missed = 0
            except grpc.aio.AioRpcError as e:
                # Any answer (NOT_SERVING while draining, UNIMPLEMENTED) proves the process runs; silence does not.
                if e.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    missed = 0
                    continue
                missed += 1
                if missed >= self.misses:
                    self.found_dead += 1
                    log.warning(
                        "prefill at %s missed %d health probes in a row: failing its hand-offs over", address, missed
                    )
                    w.dead.set()
                    return
