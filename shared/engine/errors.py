"""Typed errors the engine raises for user input and capacity, so callers map them to protocol codes.

InvalidRequest -> HTTP 400 / gRPC INVALID_ARGUMENT (do not retry); QueueFull -> HTTP 503 / gRPC
RESOURCE_EXHAUSTED (retry, possibly elsewhere); RequestFailed -> HTTP 500 naming the reason / pdrelay
REQUEST_FAILED (the request's own failure: not retried, never held against the instance). Internal invariants use
assert instead.
"""

from __future__ import annotations

from shared.modelspec.errors import InvalidRequest

__all__ = ["EngineError", "InvalidRequest", "QueueFull", "RankLost", "RequestFailed", "UnknownRequest"]


class EngineError(Exception):
    """Base class of errors the engine raises on purpose (but InvalidRequest: the request's own fault, found
    anywhere from the gateway to the engine, lives in shared/modelspec/errors.py)."""


class QueueFull(EngineError):
    """The waiting queue is at max_queued_requests; the request may be retried later or on another instance."""

    retryable = True


class UnknownRequest(EngineError, KeyError):
    """An operation named a request id the engine does not know (never added, or already finished)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class RequestFailed(EngineError):
    """Processing this one request failed (its logits processing, grammar step, detokenizing or stop check) and
    it was aborted; the engine and the other requests of its batch go on untouched. Neither the client's input
    (that is InvalidRequest, refused before admission) nor a sick instance: a circuit breaker never counts it."""


class RankLost(EngineError):
    """A tensor-parallel rank of this instance exited or stopped answering: no step can be computed without it, so
    the engine stops (its streams end with this error) instead of failing every later step one by one."""
