"""The local actuator: the supervisor of `pdrelay up`, through the scale request `pdrelay scale` sends.

A manual `pdrelay scale` goes over the same subject; the planner listens there too (without answering) and takes
what an operator asked for as a pin. With the cluster secret (--admin-secret-file) the planner signs its own
requests (the supervisor refuses unsigned ones) and takes only signed requests of others as pins.
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.aio.subscription import Subscription

from services.planner.actuators.base import DrainTarget, ScaleError
from shared.cluster.bus.admin_auth import AdminAuth
from shared.cluster.bus.client import Bus, Meta
from shared.cluster.bus.scale import ScaleRequest, observe_scale, request_scale

PLANNER_ORIGIN = "planner"


class LocalActuator:
    name = "local"

    def __init__(self, bus: Bus, cluster: str, *, timeout_s: float = 10.0, auth: AdminAuth | None = None) -> None:
        self._bus = bus
        self._auth = auth
        self._cluster = cluster
        self._timeout_s = timeout_s
        self._desired: dict[str, int] = {}
        self._manual: dict[str, int] = {}
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await observe_scale(self._bus, self._cluster, self._on_request)

    def _on_request(self, req: ScaleRequest, meta: Meta) -> None:
        if req.origin == PLANNER_ORIGIN:
            return
        if self._auth is not None and self._auth.check(meta.subject, meta.data, meta.headers) is not None:
            return  # a forged request changes nothing at the supervisor, so it pins nothing here either
        self._manual.update(req.targets)
        self._desired.update(req.targets)

    async def scale(self, role: str, target: int, drain: Sequence[DrainTarget] = ()) -> str:
        try:
            reply = await request_scale(
                self._bus,
                self._cluster,
                {role: target},
                timeout_s=self._timeout_s,
                origin=PLANNER_ORIGIN,
                drain=tuple(d.instance_id for d in drain),
                auth=self._auth,
            )
        except TimeoutError as e:
            raise ScaleError(f"the local supervisor did not answer ({e}); is `pdrelay up` running?") from None
        if not reply.ok:
            raise ScaleError(f"the local supervisor refused: {reply.message}")
        self._desired[role] = reply.counts.get(role, target)
        what = reply.message
        if reply.started:
            what += f"; starting {', '.join(reply.started)}"
        if reply.draining:
            what += f"; draining {', '.join(reply.draining)}"
        return what

    def desired(self, role: str) -> int | None:
        return self._desired.get(role)

    async def refresh(self) -> None:
        """Nothing to read: manual requests arrive on the subscription."""

    def take_manual(self) -> dict[str, int]:
        out, self._manual = self._manual, {}
        return out

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # NATS already closed  # noqa: BLE001
                pass
            self._sub = None
