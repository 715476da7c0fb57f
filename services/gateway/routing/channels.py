"""One gRPC channel per instance, created on first use and closed when the instance leaves.

A channel is keyed by instance id and address: an instance that re-registers on another port gets a new channel
(the old one is closed). Closing an instance that left after draining is deferred by a grace period so that a
stream still running on it is not cut off. An instance that vanished without draining (its lease expired: killed,
hung, partitioned) is presumed dead: its channel closes after `lost_grace_s`, which fails the calls still waiting on
it, and the backend replays them elsewhere instead of letting them wait for a peer that does not answer. An instance
that registers again at the same address within that grace (a lease that lapsed on a busy machine while the process
kept serving) keeps its channel and its streams (`revive`). With `tls`, channels are mutual TLS.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from shared.cluster.tls import TlsFiles, open_channel

log = logging.getLogger(__name__)

# Generation streams can carry long prompts (token ids) and many logprobs.
_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # Re-dial a restarted instance quickly instead of backing off for up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class ChannelPool:
    def __init__(self, *, close_grace_s: float = 30.0, lost_grace_s: float = 1.0, tls: TlsFiles | None = None) -> None:
        self._tls = tls
        self._channels: dict[str, tuple[str, grpc.aio.Channel]] = {}
        self._close_grace_s = close_grace_s
        self._lost_grace_s = lost_grace_s
        self._lost: dict[str, tuple[str, grpc.aio.Channel, asyncio.TimerHandle]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, instance_id: str, address: str) -> grpc.aio.Channel:
        self.revive(instance_id, address)
        entry = self._channels.get(instance_id)
        if entry is not None:
            if entry[0] == address:
                return entry[1]
            self._close_later(entry[1])
        channel = open_channel(address, self._tls, _OPTIONS)
        self._channels[instance_id] = (address, channel)
        return channel

    def discard(self, instance_id: str, *, lost: bool = False) -> None:
        """The instance left: close its channel once in-flight streams had `close_grace_s` to finish, or, when it
        was `lost` rather than drained, cancel its calls after `lost_grace_s` unless it comes back (`revive`)."""
        entry = self._channels.pop(instance_id, None)
        if entry is None:
            return
        if not lost:
            self._close_later(entry[1])
            return
        address, channel = entry
        timer = asyncio.get_running_loop().call_later(self._lost_grace_s, self._close_lost, instance_id, channel)
        self._lost[instance_id] = (address, channel, timer)

    def revive(self, instance_id: str, address: str) -> None:
        """The instance registered again: a channel still in its lost grace at the same address is kept."""
        lost = self._lost.pop(instance_id, None)
        if lost is None:
            return
        lost[2].cancel()
        if lost[0] == address and instance_id not in self._channels:
            self._channels[instance_id] = (lost[0], lost[1])
        else:
            self._close_later(lost[1], 0.0)

    def _close_lost(self, instance_id: str, channel: grpc.aio.Channel) -> None:
        entry = self._lost.get(instance_id)
        if entry is not None and entry[1] is channel:
            del self._lost[instance_id]
            self._close_later(channel, 0.0)

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._channels

    def __len__(self) -> int:
        return len(self._channels)

    def _close_later(self, channel: grpc.aio.Channel, grace_s: float | None = None) -> None:
        grace = self._close_grace_s if grace_s is None else grace_s
        task = asyncio.ensure_future(channel.close(grace=grace or None))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        channels = [ch for _, ch in self._channels.values()]
        for _, ch, timer in self._lost.values():
            timer.cancel()
            channels.append(ch)
        self._channels.clear()
        self._lost.clear()
        for ch in channels:
            await ch.close(grace=None)
        for task in list(self._closing):
            task.cancel()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
