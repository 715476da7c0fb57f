"""The server side of one request RPC: its span, the request id in the logs, errors counted by code, token timing.

    with tel.server_rpc(spans.DECODE_GENERATE, request.trace, context, request.request_id, attrs) as rpc:
        ...                    # child spans and NATS publishes see rpc.span as the current span
        rpc.fail(code, msg)    # an error sent as a message instead of a gRPC status

A gRPC abort (`grpc.aio.AbortError`) leaving the block is read back from the context: the pdrelay error code in
the trailing metadata (shared.cluster.grpc_errors) labels `pdrelay:request_errors_total` and the span's status.
Cancellation (the caller went away) is not an error of this service: the span gets `pdrelay.cancelled` instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc

from proto.pdrelay.v1 import common_pb2
from shared.cluster.grpc_errors import ERROR_METADATA_KEY
from shared.telemetry import spans
from shared.telemetry.logs import bind_request_id, unbind_request_id
from shared.telemetry.metrics import RequestMetrics, ServiceMetrics, error_label
from shared.telemetry.tracing import Tracing, extract, set_error

if TYPE_CHECKING:
    from opentelemetry.trace import Span


def _error_of(context: grpc.aio.ServicerContext) -> tuple[int, str]:
    """(pdrelay error code, message) of an aborted RPC, from the typed Error in its trailing metadata."""
    try:
        for key, value in context.trailing_metadata() or ():
            if key == ERROR_METADATA_KEY and isinstance(value, bytes):
                err = common_pb2.Error.FromString(value)
                return err.code, err.message
        details = context.details() or ""
    except Exception:  # reading back a context is best effort; the RPC already ended  # noqa: BLE001
        details = ""
    return common_pb2.ERROR_CODE_INTERNAL, details if isinstance(details, str) else ""


class ServerRpc:
    __slots__ = (
        "_tracing",
        "_metrics",
        "_instance_id",
        "_name",
        "_carrier",
        "_context",
        "_request_id",
        "_attributes",
        "span",
        "_token",
        "_rid_token",
        "failed",
    )

    def __init__(
        self,
        tracing: Tracing,
        metrics: ServiceMetrics,
        instance_id: str,
        name: str,
        carrier: common_pb2.TraceContext | None,
        context: grpc.aio.ServicerContext | None,
        request_id: str,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """tracing, metrics, instance_id: the service's (ServiceTelemetry.server_rpc passes its own)."""
        self._tracing = tracing
        self._metrics = metrics
        self._instance_id = instance_id
        self._name = name
        self._carrier = carrier
        self._context = context
        self._request_id = request_id
        self._attributes = attributes
        self.span: Span | None = None
        self._token: object | None = None
        self._rid_token: Any = None
        self.failed = False

    def __enter__(self) -> ServerRpc:
        from opentelemetry.trace import INVALID_SPAN, SpanKind

        self._rid_token = bind_request_id(self._request_id)
        tr = self._tracing
        if not tr.enabled:
            self.span = INVALID_SPAN
            return self
        parent = extract(self._carrier)
        if parent is None and self._context is not None:
            parent = extract(
                (k, v)
                for k, v in (self._context.invocation_metadata() or ())
                if k in ("traceparent", "tracestate") and isinstance(v, str)
            )
        attrs = {spans.REQUEST_ID: self._request_id, spans.INSTANCE: self._instance_id, **(self._attributes or {})}
        self.span = tr.start_span(self._name, parent=parent, kind=SpanKind.SERVER, attributes=attrs)
        self._token = tr.activate(self.span)
        return self

    def fail(self, code: int, message: str) -> None:
        """This request ended with pdrelay error `code` (counted once per request)."""
        if self.failed:
            return
        self.failed = True
        self._metrics.count_error(code)
        if self.span is not None:
            set_error(self.span, message, {spans.ERROR_CODE: error_label(code)})

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if isinstance(exc, asyncio.CancelledError):
                if self.span is not None and self.span.is_recording():
                    self.span.set_attribute("pdrelay.cancelled", True)
            elif isinstance(exc, grpc.aio.AbortError) and self._context is not None:
                self.fail(*_error_of(self._context))
            elif exc is not None and not isinstance(exc, GeneratorExit):
                self.fail(common_pb2.ERROR_CODE_INTERNAL, f"{type(exc).__name__}: {exc}")
        finally:
            self._tracing.deactivate(self._token)
            if self.span is not None and self.span.is_recording():
                self.span.end()
            unbind_request_id(self._rid_token)


class TokenTimer:
    """TTFT / ITL / e2e of one streamed request, as the server sees it (RPC arrival -> messages sent)."""

    __slots__ = ("_m", "start", "first_at", "last_at", "tokens")

    def __init__(self, metrics: RequestMetrics, start: float | None = None) -> None:
        self._m = metrics
        self.start = time.monotonic() if start is None else start
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.tokens = 0

    def on_tokens(self, n: int) -> float:
        """`n` tokens are about to be sent; returns the time taken (monotonic seconds)."""
        now = time.monotonic()
        if n:
            if self.last_at is None:
                self.first_at = now
                self._m.ttft.observe(now - self.start)
            else:
                self._m.itl.observe(now - self.last_at)
            self.last_at = now
            self.tokens += n
        return now

    def finished(self) -> None:
        self._m.e2e.observe(time.monotonic() - self.start)
