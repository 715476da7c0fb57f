"""Which encoder takes a request: READY instances of role "encoder" that serve the modality and model, by load.

Load = the instance's latest NATS report (in-flight RPCs + inputs waiting for a forward), when fresh and of its
current epoch, plus the requests this gateway sent it since (reports lag by up to one interval), relative to its
capacity. Ties go round-robin so equal encoders share the work. `exclude` skips instances that already failed the
request. A `prefer` key (e.g. a media hash) may name the instance to try first when it is a candidate: cache
affinity for the vision path, by load otherwise.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass

from services.gateway.routing.discovery import MembershipView
from shared.cluster.bus.load import LoadTable
from shared.cluster.instance import EncoderInfo, InstanceInfo, Modality
from shared.config.roles import Role

ENCODER_ROLE = Role.ENCODER


@dataclass(frozen=True, slots=True)
class EncoderCandidate:
    instance_id: str
    grpc_address: str
    epoch: int
    info: EncoderInfo
    capacity: int  # capacity.max_running_requests (0: unknown)
    reported: int = 0  # running + queued in its latest fresh report


def serves(info: InstanceInfo, modality: Modality, model: str | None) -> bool:
    enc = info.encoder
    if enc is None or modality not in enc.modalities:
        return False
    name = enc.embedding_model if modality is Modality.EMBEDDING else enc.vision_model
    return model is None or name == model


class EncoderRouter:
    def __init__(self, membership: MembershipView, loads: LoadTable, *, max_load_age_s: float = 2.0) -> None:
        self.membership = membership
        self.loads = loads
        self.max_load_age_s = max_load_age_s
        self.inflight: dict[str, int] = {}  # requests this gateway has outstanding per encoder
        self._tiebreak = itertools.count()

    def candidates(self, modality: Modality, model: str | None = None) -> list[EncoderCandidate]:
        out = []
        for info in self.membership.ready(ENCODER_ROLE):
            if not serves(info, modality, model):
                continue
            assert info.encoder is not None
            report = self.loads.latest.get(info.instance_id)
            age = self.loads.age_s(info.instance_id)
            reported = 0
            if report is not None and age is not None and age <= self.max_load_age_s and report.epoch >= info.epoch:
                reported = report.load.running + report.load.queued
            out.append(
                EncoderCandidate(
                    info.instance_id,
                    info.grpc_address,
                    info.epoch,
                    info.encoder,
                    info.capacity.max_running_requests,
                    reported,
                )
            )
        return out

    def embedding_models(self) -> dict[str, EncoderInfo]:
        """Served embedding model name -> what one of its ready encoders registered."""
        out: dict[str, EncoderInfo] = {}
        for c in self.candidates(Modality.EMBEDDING):
            out.setdefault(c.info.embedding_model, c.info)
        return out

    def pick(
        self, candidates: Collection[EncoderCandidate], exclude: Collection[str] = (), prefer: str | None = None
    ) -> EncoderCandidate | None:
        live = [c for c in candidates if c.instance_id not in exclude]
        if not live:
            return None
        if prefer is not None:
            for c in live:
                if c.instance_id == prefer:
                    return c
        turn = next(self._tiebreak)

        def cost(ic: tuple[int, EncoderCandidate]) -> tuple[float, int]:
            i, c = ic
            busy = c.reported + self.inflight.get(c.instance_id, 0)
            return busy / max(1, c.capacity), (i - turn) % len(live)

        return min(enumerate(live), key=cost)[1]

    def begin(self, instance_id: str) -> None:
        self.inflight[instance_id] = self.inflight.get(instance_id, 0) + 1

    def end(self, instance_id: str) -> None:
        n = self.inflight.get(instance_id, 0) - 1
        if n > 0:
            self.inflight[instance_id] = n
        else:
            self.inflight.pop(instance_id, None)
