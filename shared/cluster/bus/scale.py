"""`pdrelay scale role=N ...`: a request to the local-cluster supervisor, answered with what it did.

With an AdminAuth (shared.cluster.bus.admin_auth) the request is signed, and the supervisor refuses one that is
not signed with the cluster secret (ok=False, and a log line).
"""

from __future__ import annotations

import inspect

import msgspec
from nats.aio.subscription import Subscription

from shared.cluster.bus import subjects
from shared.cluster.bus.admin_auth import AdminAuth
from shared.cluster.bus.client import Bus, Handler, Meta, Responder


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True):
    targets: dict[str, int]  # role -> wanted number of instances
    origin: str = "operator"  # "operator" (`pdrelay scale`) | "planner": the planner treats the others as pins
    drain: tuple[str, ...] = ()  # on scale-down, drain these instances first (e.g. the idlest one)


class ScaleReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str = ""
    started: tuple[str, ...] = ()  # instance ids launched
    draining: tuple[str, ...] = ()  # instance ids told to drain
    counts: dict[str, int] = msgspec.field(default_factory=dict)  # role -> instances after the change


async def request_scale(
    bus: Bus,
    cluster: str,
    targets: dict[str, int],
    *,
    timeout_s: float = 5.0,
    origin: str = "operator",
    drain: tuple[str, ...] = (),
    auth: AdminAuth | None = None,
) -> ScaleReply:
    subject = subjects.supervisor_scale(cluster)
    payload = bus.encode(ScaleRequest(targets=targets, origin=origin, drain=drain))
    return await bus.request_raw(
        subject, payload, ScaleReply, timeout_s=timeout_s, headers=auth.sign_headers(subject, payload) if auth else None
    )


async def observe_scale(bus: Bus, cluster: str, handler: Handler[ScaleRequest]) -> Subscription:
    """See every scale request (a plain subscriber next to the supervisor's responder; it does not answer)."""
    return await bus.subscribe(subjects.supervisor_scale(cluster), ScaleRequest, handler)


async def serve_scale(
    bus: Bus, cluster: str, responder: Responder[ScaleRequest, ScaleReply], *, auth: AdminAuth | None = None
) -> Subscription:
    """Answer scale requests; with `auth`, unsigned or wrongly signed ones get ok=False and are not acted on."""
    if auth is None:
        return await bus.serve(subjects.supervisor_scale(cluster), ScaleRequest, responder)

    async def verified(req: ScaleRequest, meta: Meta) -> ScaleReply:
        why = auth.check(meta.subject, meta.data, meta.headers)
        if why is not None:
            return ScaleReply(ok=False, message=f"refused: {why}")
        res = responder(req, meta)
        return await res if inspect.isawaitable(res) else res

    return await bus.serve(subjects.supervisor_scale(cluster), ScaleRequest, verified)
