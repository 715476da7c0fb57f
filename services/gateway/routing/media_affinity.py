"""Which encoder embeds an image (EPD): the encoder known to hold its media hash, else the least-loaded one.

"Known to hold" is what this gateway routed there recently (an LRU of media hash -> encoder instance and epoch: a
restarted encoder starts with an empty cache, so an older epoch does not count). Load is the encoder's latest fresh
NATS report (running + queued) plus the images this gateway sent it since, relative to its capacity. Equal loads
(an idle cluster, several gateways that each saw nothing yet) are broken by rendezvous hashing of the media hash, so
repeats still meet one cache and a new or lost encoder moves only its share of the hashes."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from proto.pdrelay.v1 import common_pb2
from services.gateway.routing.encoders import EncoderCandidate, EncoderRouter
from shared.cluster.instance import Modality

REMEMBERED = 65536  # media hashes remembered (about the images a few encoder caches hold)


def _score(media_hash: str, instance_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{media_hash}/{instance_id}".encode(), digest_size=8).digest(), "little")


class MediaAffinity:
    """Implements the encoder choice for images; one event loop, not thread-safe. `router` gives the ready image
    encoders of a model with their reported loads (services.gateway.routing.encoders)."""

    def __init__(
        self, router: EncoderRouter, *, remembered: int = REMEMBERED, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.router = router
        self.remembered = remembered
        self.clock = clock
        self.holders: OrderedDict[str, tuple[str, int]] = OrderedDict()  # media hash -> (instance id, epoch)
        self._sent: dict[str, deque[float]] = {}  # instance id -> when images went there (monotonic)

    def encoders(self, model: str) -> list[EncoderCandidate]:
        return [c for c in self.router.candidates(Modality.IMAGE, model) if c.grpc_address]

    def pick(self, media_hash: str, encoders: Sequence[EncoderCandidate]) -> EncoderCandidate | None:
        if not encoders:
            return None
        held = self.holders.get(media_hash)
        if held is not None:
            for c in encoders:
                if (c.instance_id, c.epoch) == held:
                    self.holders.move_to_end(media_hash)
                    return c
        return min(encoders, key=lambda c: (self._load(c), -_score(media_hash, c.instance_id)))

    def assign(self, media: Sequence[common_pb2.MediaInput], model: str) -> None:
        """Set each item's EncoderTarget (left unset without encoders: prefill then encodes it itself)."""
        encoders = self.encoders(model)
        for m in media:
            e = self.pick(m.media_hash, encoders)
            if e is None:
                return
            m.encoder.CopyFrom(common_pb2.EncoderTarget(instance_id=e.instance_id, grpc_address=e.grpc_address))
            self._remember(m.media_hash, e)

    def _remember(self, media_hash: str, e: EncoderCandidate) -> None:
        self.holders[media_hash] = (e.instance_id, e.epoch)
        self.holders.move_to_end(media_hash)
        while len(self.holders) > self.remembered:
            self.holders.popitem(last=False)
        self._sent.setdefault(e.instance_id, deque()).append(self.clock())

    def _load(self, c: EncoderCandidate) -> float:
        """Reported work plus the images sent since that report (a report lags by up to one interval)."""
        sent = self._sent.get(c.instance_id)
        since = 0
        if sent:
            now, window = self.clock(), self.router.max_load_age_s
            while sent and sent[0] < now - window:
                sent.popleft()
            age = self.router.loads.age_s(c.instance_id)
            horizon = now - (window if age is None else min(age, window))
            since = sum(1 for t in sent if t >= horizon)
        return (c.reported + since) / max(1, c.capacity)
