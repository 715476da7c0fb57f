"""Which prefills one hand-off tries, in order: the gateway's choice, fenced by its epoch, then the other ready ones
(ordered by their breakers and rates here, prefill_choice.py), at most 1 + --handoff-retries of them.

The gateway's choice is refused when etcd knows that instance with a newer epoch: it restarted since the gateway saw
it, its cache is gone and its address may be another process's; its current incarnation is asked instead (when it
is ready)."""

from __future__ import annotations

import logging

from proto.pdrelay.v1 import worker_pb2
from services.decode.prefill_choice import PrefillChoice
from shared.cluster.membership import Membership

log = logging.getLogger(__name__)

Target = tuple[str, str]  # (instance id, gRPC address)


class PrefillTargets:
    def __init__(self, instance_id: str, choice: PrefillChoice, retries: int) -> None:
        self.instance_id = instance_id
        self.choice = choice
        self.retries = retries
        self.members: Membership | None = None  # the prefill membership, once the service warmed up
        self.stale = 0  # gateway choices refused for an older epoch than etcd's

    def order(self, target: worker_pb2.PrefillTarget) -> list[Target]:
        """The prefills to try for one hand-off, first to last."""
        targets: list[Target] = []
        first = self.first(target)
        if first is not None:
            targets.append(first)
        targets += [t for t in self.alternates(target.instance_id) if t not in targets]
        return self.choice.order(targets)[: 1 + self.retries]

    def first(self, target: worker_pb2.PrefillTarget) -> Target | None:
        """The gateway's choice, fenced by its epoch (see the module docstring); None when it has none left."""
        if not target.grpc_address:
            return None
        members = self.members
        if members is None or not target.epoch:
            return target.instance_id, target.grpc_address
        current = next((m for m in members.instances("prefill") if m.instance_id == target.instance_id), None)
        if current is None or current.epoch <= target.epoch:
            return target.instance_id, target.grpc_address  # our view may lag the gateway's: trust it
        self.stale += 1
        log.warning(
            "%s: prefill %s epoch %d chosen by the gateway is stale (etcd has epoch %d); refused",
            self.instance_id,
            target.instance_id,
            target.epoch,
            current.epoch,
        )
        ready = {m.instance_id for m in members.ready("prefill")}
        return (current.instance_id, current.grpc_address) if current.instance_id in ready else None

    def alternates(self, exclude: str) -> list[Target]:
        """The other ready prefills."""
        members = self.members
        if members is None:
            return []
        return [(m.instance_id, m.grpc_address) for m in members.ready("prefill") if m.instance_id != exclude]
