"""What a failed call to a decode/worker instance means for routing: retry or not, whom to avoid, whom to blame.

Pure functions of the gRPC status, the typed pdrelay `Error` in the trailers (shared.cluster.grpc_errors) and the
plan that was tried. Three questions per failure:

    retry?     the request itself is wrong (INVALID_ARGUMENT, NOT_FOUND) or failed alone on a healthy instance
               (REQUEST_FAILED: it would fail the same way anywhere) -> no; anything else -> yes, elsewhere
    exclude    instances not to try again for this request
    blame      instances whose circuit breaker records a failure: only server-side failures (unreachable,
               crashed, INTERNAL). Overloaded / draining / stale-epoch refusals are the protocol working, not a
               sick instance; they never open a breaker.

Pair hand-offs: a typed error returned by a decode instance in a disaggregated plan before the first token (other
than overload/draining/bad input) is attributed to the hand-off, so the prefill is excluded and the pair is chosen
again; the decode answered, so it is alive. An untyped failure (connection refused or reset, no pdrelay Error) is
the instance the gateway talked to: the decode.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc

from proto.pdrelay.v1 import common_pb2
from services.gateway.routing.views import RoutePlan

_E = common_pb2


class FailureKind(enum.StrEnum):
    INVALID = "invalid"  # the request can never succeed as sent
    NOT_FOUND = "not_found"  # unknown model (or id) on the instance
    OVERLOADED = "overloaded"  # queue full / no KV pages: try another instance or later
    DRAINING = "draining"  # shutting down: try another instance
    REQUEST = "request"  # processing this request failed on a healthy instance (the request's fault, not the server's)
    HANDOFF = "handoff"  # the prefill side of a pair failed or refused: re-choose the pair
    SERVER = "server"  # crashed, unreachable, internal error


@dataclass(frozen=True)
class Verdict:
    kind: FailureKind
    message: str
    exclude: frozenset[str] = frozenset()
    blame: frozenset[str] = frozenset()

    @property
    def retryable(self) -> bool:
        return self.kind not in (FailureKind.INVALID, FailureKind.NOT_FOUND, FailureKind.REQUEST)

    @property
    def uses_retry_budget(self) -> bool:
        """Refusals at admission are cheap and bounded by the number of instances; failures cost a retry."""
        return self.kind in (FailureKind.HANDOFF, FailureKind.SERVER)


_HANDOFF_CODES = frozenset(
    {
        _E.ERROR_CODE_TRANSFER_FAILED,
        _E.ERROR_CODE_CHECKSUM_MISMATCH,
        _E.ERROR_CODE_LAYOUT_MISMATCH,
        _E.ERROR_CODE_STALE_EPOCH,
    }
)


def classify(
    status: grpc.StatusCode,
    error: common_pb2.Error | None,
    plan: RoutePlan,
    *,
    details: str = "",
    started: bool = False,
) -> Verdict:
    """The verdict on one failed attempt. `started`: tokens were already streamed by this attempt."""
    decode = plan.decode.instance_id
    prefill = plan.prefill.instance_id if plan.prefill is not None else None
    msg = (error.message if error is not None and error.message else details) or status.name
    if error is not None and error.code != _E.ERROR_CODE_UNSPECIFIED:
        return _typed(error, msg, decode, prefill, started)
    if status == grpc.StatusCode.INVALID_ARGUMENT:
        return Verdict(FailureKind.INVALID, msg)
    if status == grpc.StatusCode.NOT_FOUND:
        return Verdict(FailureKind.NOT_FOUND, msg)
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return Verdict(FailureKind.OVERLOADED, msg, exclude=frozenset({decode}))
    if status == grpc.StatusCode.FAILED_PRECONDITION and prefill is not None and not started:
        return Verdict(FailureKind.HANDOFF, msg, exclude=frozenset({prefill}))
    # Untyped and anything else: the process we talked to is unreachable, died, or broke.
    return Verdict(FailureKind.SERVER, msg, exclude=frozenset({decode}), blame=frozenset({decode}))


def _typed(error: common_pb2.Error, msg: str, decode: str, prefill: str | None, started: bool) -> Verdict:
    code = error.code
    if code == _E.ERROR_CODE_INVALID_ARGUMENT:
        return Verdict(FailureKind.INVALID, msg)
    if code == _E.ERROR_CODE_NOT_FOUND:
        return Verdict(FailureKind.NOT_FOUND, msg)
    if code == _E.ERROR_CODE_REQUEST_FAILED:  # before or after the first token, on prefill or decode: no blame
        return Verdict(FailureKind.REQUEST, msg)
    who = error.instance_id or decode
    if code == _E.ERROR_CODE_OVERLOADED:
        return Verdict(FailureKind.OVERLOADED, msg, exclude=frozenset({who}))
    if code == _E.ERROR_CODE_DRAINING:
        return Verdict(FailureKind.DRAINING, msg, exclude=frozenset({who}))
    if prefill is not None and not started and (who == prefill or who == decode):
        # Before the first token of a pair, a typed failure is the hand-off's (see the module docstring); the
        # prefill is blamed only when it says so itself, or when the failure is a server-side one it reported.
        blame = (
            frozenset({prefill})
            if who == prefill and code in (_E.ERROR_CODE_INTERNAL, _E.ERROR_CODE_UNAVAILABLE)
            else frozenset()
        )
        return Verdict(FailureKind.HANDOFF, msg, exclude=frozenset({prefill}), blame=blame)
    if code in _HANDOFF_CODES:
        return Verdict(FailureKind.HANDOFF, msg, exclude=frozenset({who}))
    # INTERNAL, UNAVAILABLE, TIMEOUT, CANCELLED, ... reported by the instance itself: a sick instance.
    return Verdict(FailureKind.SERVER, msg, exclude=frozenset({who}), blame=frozenset({who}))


def classify_stream_end(plan: RoutePlan) -> Verdict:
    """The stream ended cleanly but without a finish reason: the instance went away mid-request."""
    d = plan.decode.instance_id
    return Verdict(
        FailureKind.SERVER,
        f"{d} ended the stream without a finish reason",
        exclude=frozenset({d}),
        blame=frozenset({d}),
    )


def classify_lost(plan: RoutePlan) -> Verdict:
    """The call was cut because the instance left without draining (its lease expired): it is dead or hung."""
    d = plan.decode.instance_id
    return Verdict(
        FailureKind.SERVER,
        f"{d} lost its etcd lease (dead, hung or cut off) while serving the request",
        exclude=frozenset({d}),
        blame=frozenset({d}),
    )
