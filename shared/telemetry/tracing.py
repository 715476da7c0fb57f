"""OpenTelemetry tracing of one service process: off by default, a real tracer only with --otlp-traces-endpoint.

Off: `Tracing.off()` holds OpenTelemetry's NoOpTracer, no TracerProvider, no exporter and no threads; every helper
below returns at its first line (`if not self.enabled`), so instrumented code costs a branch per call.
On: a TracerProvider (service.name = "pdrelay-<role>", resource attributes for the instance, its registration
epoch and the cluster) sampling ParentBased(TraceIdRatioBased(--trace-sample-ratio)), and a BatchSpanProcessor
exporting over OTLP/gRPC (one background thread).

No auto-instrumentation and no global provider: spans are opened explicitly where the work happens, and the W3C
trace context travels explicitly, in the TraceContext fields of DecodeRequest / HandoffTicket and in NATS message
headers. Many phases are recorded after the fact from timestamps the code takes anyway (`record`), which keeps the
request path free of context managers that would straddle `await`s and `yield`s.

Times: the helpers take `time.monotonic()` seconds (the clock the services already use; on Linux the same clock
as `time.perf_counter()`, see perf_to_mono), converted to the epoch nanoseconds OpenTelemetry wants when called.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proto.pdrelay.v1 import common_pb2

log = logging.getLogger(__name__)

TRACER_NAME = "pdrelay"
EXPORT_INTERVAL_S = 0.5  # BatchSpanProcessor delay: spans show up in the collector within about a second
EXPORT_TIMEOUT_S = 5.0  # a dead collector must not hold up shutdown for long

_PROPAGATOR = TraceContextTextMapPropagator()
Parent = Span | Context | None
Attributes = Mapping[str, Any]


def service_name(role: str) -> str:
    return f"pdrelay-{role}"


def mono_ns(t: float) -> int:
    """A `time.monotonic()` reading as epoch nanoseconds (what span start/end times are)."""
    return time.time_ns() - int((time.monotonic() - t) * 1e9)


def perf_to_mono(t: float) -> float:
    """A `time.perf_counter()` reading on the `time.monotonic()` clock (the same clock on Linux)."""
    return t + (time.monotonic() - time.perf_counter())


def check_endpoint(endpoint: str) -> str:
    """'host:port' or 'http(s)://host:port' (what the OTLP/gRPC exporter takes); ValueError naming the fix."""
    rest = endpoint.split("://", 1)[1] if "://" in endpoint else endpoint
    host, _, port = rest.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"--otlp-traces-endpoint {endpoint!r} must be host:port or http://host:port of an OTLP/gRPC "
            "collector; e.g. http://127.0.0.1:4317"
        )
    return endpoint


# ------------------------------------------------------------------ propagation


def traceparent_of(span: Span) -> str:
    """The W3C traceparent header of `span` ("" when it has no valid context, e.g. a no-op span)."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return ""
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def inject(span: Span, carrier: common_pb2.TraceContext) -> None:
    """Write `span`'s context into a TraceContext message (left as it is when the span is not valid, so a client's
    own trace context passes through a service that does not trace)."""
    parent = traceparent_of(span)
    if parent:
        carrier.traceparent = parent
        carrier.tracestate = span.get_span_context().trace_state.to_header()


def extract(carrier: common_pb2.TraceContext | Mapping[str, str] | Iterable[tuple[str, str]] | None) -> Context | None:
    """The remote parent in a TraceContext message, a header mapping or (name, value) pairs; None without one."""
    if carrier is None:
        return None
    if isinstance(carrier, common_pb2.TraceContext):
        if not carrier.traceparent:
            return None
        headers: Mapping[str, str] = {"traceparent": carrier.traceparent, "tracestate": carrier.tracestate}
    elif isinstance(carrier, Mapping):
        headers = carrier
    else:
        headers = dict(carrier)
    if "traceparent" not in headers:
        return None
    ctx = _PROPAGATOR.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


# ------------------------------------------------------------------ the tracer of a process


class Tracing:
    """The tracer of one service process and the helpers instrumented code calls (all no-ops when off)."""

    def __init__(self, tracer: trace.Tracer, provider: Any = None) -> None:
        self.tracer = tracer
        self._provider = provider
        self.enabled = provider is not None

    @classmethod
    def off(cls) -> Tracing:
        return cls(trace.NoOpTracer())

    @classmethod
    def start(
        cls,
        endpoint: str,
        *,
        role: str,
        instance_id: str,
        cluster: str,
        epoch: int = 0,
        sample_ratio: float = 1.0,
        exporter: Any = None,
    ) -> Tracing:
        """A real tracer exporting to `endpoint` over OTLP/gRPC (or to `exporter`, e.g. an in-memory one)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        if not 0.0 <= sample_ratio <= 1.0:
            raise ValueError(f"--trace-sample-ratio {sample_ratio} must be within [0, 1]; 1 traces every request")
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            check_endpoint(endpoint)
            exporter = OTLPSpanExporter(
                endpoint=endpoint, insecure=not endpoint.startswith("https://"), timeout=EXPORT_TIMEOUT_S
            )
        resource = Resource.create(
            {
                "service.name": service_name(role),
                "service.namespace": "pdrelay",
                "service.instance.id": instance_id,
                "pdrelay.role": role,
                "pdrelay.cluster": cluster,
                "pdrelay.epoch": epoch,
            }
        )
        provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)), resource=resource, shutdown_on_exit=False
        )
        provider.add_span_processor(
            BatchSpanProcessor(
                exporter, schedule_delay_millis=EXPORT_INTERVAL_S * 1000, export_timeout_millis=EXPORT_TIMEOUT_S * 1000
            )
        )
        return cls(provider.get_tracer(TRACER_NAME), provider)

    def shutdown(self) -> None:
        """Export what is buffered (bounded by the export timeout) and stop the exporter thread."""
        provider, self._provider = self._provider, None
        self.enabled = False
        self.tracer = trace.NoOpTracer()
        if provider is not None:
            try:
                provider.force_flush(int(EXPORT_TIMEOUT_S * 1000))
                provider.shutdown()
            except Exception:  # telemetry must never fail a shutdown
                log.exception("tracing shutdown failed")

    # ---- spans ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _context(parent: Parent) -> Context | None:
        if parent is None or isinstance(parent, Context):
            return parent
        return trace.set_span_in_context(parent)

    def start_span(
        self,
        name: str,
        *,
        parent: Parent = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes | None = None,
        start: float | None = None,
    ) -> Span:
        """Open a span (not made current); end it with `end()`. Parent None: the current span."""
        if not self.enabled:
            return trace.INVALID_SPAN
        return self.tracer.start_span(
            name,
            context=self._context(parent),
            kind=kind,
            attributes=attributes,
            start_time=None if start is None else mono_ns(start),
        )

    @staticmethod
    def end(span: Span, end: float | None = None, attributes: Attributes | None = None) -> None:
        if not span.is_recording():
            return
        if attributes:
            span.set_attributes(attributes)
        span.end(None if end is None else mono_ns(end))

    def record(
        self,
        name: str,
        start: float,
        end: float,
        attributes: Attributes | None = None,
        *,
        parent: Parent = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Span:
        """A finished phase [start, end] (monotonic seconds), recorded after the fact."""
        if not self.enabled:
            return trace.INVALID_SPAN
        span = self.tracer.start_span(
            name, context=self._context(parent), kind=kind, attributes=attributes, start_time=mono_ns(start)
        )
        span.end(mono_ns(end))
        return span

    def activate(self, span: Span) -> object | None:
        """Make `span` the current span of this task (children and NATS headers see it); pass the token to
        `deactivate` in the same task."""
        if not span.is_recording():
            return None
        return otel_context.attach(trace.set_span_in_context(span))

    @staticmethod
    def deactivate(token: object | None) -> None:
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]  # the token activate() returned

    def headers(self) -> dict[str, str]:
        """The current span's W3C headers (for NATS messages); {} when there is none."""
        if not self.enabled:
            return {}
        span = trace.get_current_span()
        parent = traceparent_of(span)
        if not parent:
            return {}
        state = span.get_span_context().trace_state.to_header()
        return {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}


def current_span() -> Span:
    return trace.get_current_span()


def set_error(span: Span, message: str, attributes: Attributes | None = None) -> None:
    if span.is_recording():
        span.set_status(Status(StatusCode.ERROR, message))
        if attributes:
            span.set_attributes(attributes)


def add_event(span: Span, name: str, attributes: Attributes | None = None, at: float | None = None) -> None:
    """An event on `span`, at monotonic time `at` (default now)."""
    if span.is_recording():
        span.add_event(name, attributes, None if at is None else mono_ns(at))


__all__ = [
    "Context",
    "Span",
    "SpanKind",
    "Tracing",
    "add_event",
    "check_endpoint",
    "current_span",
    "extract",
    "inject",
    "mono_ns",
    "perf_to_mono",
    "service_name",
    "set_error",
    "traceparent_of",
]
