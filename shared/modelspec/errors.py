"""The error a request that can never be served as sent raises, wherever it is found: by the gateway's planning, by
SamplingParams.validate, or by the engine (shared/engine/errors.py re-exports it)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """The request can never be served as sent (bad sampling values, prompt too long, duplicate id...): HTTP 400 /
    gRPC INVALID_ARGUMENT, never retried. `field` names the offending value so an API layer can point at it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
