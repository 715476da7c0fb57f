"""The server side of a request RPC over a real grpc.aio server: the span is a child of the caller's trace context
(TraceContext field, else the traceparent metadata), an abort's pdrelay error code labels the error counter and the
span status, a cancelled call is not an error, and the request id is bound for the handler's logs."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from proto.pdrelay.v1 import common_pb2
from shared.cluster.grpc_errors import abort
from shared.telemetry.logs import current_request_id
from shared.telemetry.rpc import TokenTimer
from shared.telemetry.service import ServiceTelemetry
from shared.telemetry.tracing import Tracing

CALLER_TRACE = "7" * 32
CALLER_SPAN = "8" * 16


@pytest.fixture
async def served():
    exporter = InMemorySpanExporter()
    tel = ServiceTelemetry(None, role="decode", instance_id="decode-9", cluster="c")
    tel.tracing = Tracing.start("unused:1", role="decode", instance_id="decode-9", cluster="c", exporter=exporter)
    seen: dict[str, str] = {}

    async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        tc = common_pb2.TraceContext.FromString(request)
        with tel.server_rpc("test.rpc", tc if tc.traceparent else None, context, "req-" + tc.tracestate):
            seen["request_id"] = current_request_id()
            if tc.tracestate == "fail":
                await abort(context, common_pb2.ERROR_CODE_OVERLOADED, "full; retry elsewhere")
            if tc.tracestate == "slow":
                await asyncio.sleep(10)
            return b"ok"

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("t.T", {"Call": grpc.unary_unary_rpc_method_handler(handle)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/t.T/Call")
    yield tel, exporter, call, seen
    await channel.close()
    await server.stop(None)
    tel.tracing.shutdown()


def _spans(tel: ServiceTelemetry, exporter: InMemorySpanExporter):
    tel.tracing._provider.force_flush()  # type: ignore[union-attr]
    return exporter.get_finished_spans()


async def _wait_spans(tel: ServiceTelemetry, exporter: InMemorySpanExporter, n: int = 1):
    """The finished spans once there are `n`: an abort or a cancel reaches the caller before the server's handler
    has left its `with` block, so the span may end a moment after the client sees the status."""
    for _ in range(250):
        if len(_spans(tel, exporter)) >= n:
            break
        await asyncio.sleep(0.02)
    return _spans(tel, exporter)


async def test_span_is_a_child_of_the_callers_context(served):
    tel, exporter, call, seen = served
    tc = common_pb2.TraceContext(traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", tracestate="a")
    assert await call(tc.SerializeToString()) == b"ok"
    meta = (("traceparent", f"00-{'9' * 32}-{CALLER_SPAN}-01"),)
    assert await call(common_pb2.TraceContext(tracestate="b").SerializeToString(), metadata=meta) == b"ok"
    a, b = _spans(tel, exporter)
    assert f"{a.context.trace_id:032x}" == CALLER_TRACE and f"{a.parent.span_id:016x}" == CALLER_SPAN
    assert f"{b.context.trace_id:032x}" == "9" * 32  # from the metadata when the message has none
    assert a.attributes["pdrelay.request_id"] == "req-a" and a.attributes["pdrelay.instance_id"] == "decode-9"
    assert a.status.is_ok and seen["request_id"] == "req-b" and current_request_id() == ""


async def test_abort_counts_the_error_code_and_marks_the_span(served):
    tel, exporter, call, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(common_pb2.TraceContext(tracestate="fail").SerializeToString())
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    (span,) = await _wait_spans(tel, exporter)
    assert not span.status.is_ok and span.status.description == "full; retry elsewhere"
    assert span.attributes["pdrelay.error.code"] == "overloaded"
    assert 'pdrelay:request_errors_total{code="overloaded"} 1.0' in generate_latest(tel.metrics.registry).decode()


async def test_a_cancelled_call_is_not_an_error(served):
    tel, exporter, call, _ = served
    pending = call(common_pb2.TraceContext(tracestate="slow").SerializeToString())
    await asyncio.sleep(0.2)
    pending.cancel()
    (span,) = await _wait_spans(tel, exporter)
    assert span.status.is_unset and span.attributes["pdrelay.cancelled"] is True
    assert "pdrelay:request_errors_total{" not in generate_latest(tel.metrics.registry).decode()


def test_token_timer_observes_ttft_itl_and_e2e():
    tel = ServiceTelemetry(None, role="worker", instance_id="w", cluster="c")
    m = tel.metrics.requests
    timer = TokenTimer(m)
    timer.on_tokens(0)  # a message without tokens is no token
    for n in (1, 1, 2):
        timer.on_tokens(n)
    timer.finished()
    text = generate_latest(tel.metrics.registry).decode()
    assert "pdrelay:time_to_first_token_seconds_count 1.0" in text
    assert "pdrelay:inter_token_latency_seconds_count 2.0" in text
    assert "pdrelay:e2e_request_latency_seconds_count 1.0" in text
    assert timer.tokens == 4 and timer.first_at is not None and timer.last_at >= timer.first_at
