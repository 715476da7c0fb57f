"""Tracing of one process: off is a no-op tracer with no threads; on records spans with explicit times and parents;
W3C trace context round-trips through TraceContext messages and NATS-style headers."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proto.pdrelay.v1 import common_pb2
from shared.config.groups import TelemetryConfig
from shared.telemetry.service import ServiceTelemetry
from shared.telemetry.tracing import Tracing, add_event, check_endpoint, extract, inject, mono_ns, traceparent_of


def _otel_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if "otel" in t.name.lower() or "span" in t.name.lower()}


@pytest.fixture
def tracing():
    exporter = InMemorySpanExporter()
    tr = Tracing.start("unused:1", role="decode", instance_id="decode-7", cluster="c1", epoch=42, exporter=exporter)
    yield tr, exporter
    tr.shutdown()


def _finished(tr: Tracing, exporter: InMemorySpanExporter):
    tr._provider.force_flush()  # type: ignore[union-attr]
    return exporter.get_finished_spans()


def test_off_is_a_no_op_without_threads():
    before = set(threading.enumerate())
    tel = ServiceTelemetry(None, role="decode", instance_id="d-1", cluster="c")
    tel.start_tracing(epoch=3)  # no endpoint configured: stays off
    tr = tel.tracing
    assert not tr.enabled and tel.bus_headers_hook() is None
    span = tr.start_span("x")
    assert not span.is_recording() and traceparent_of(span) == ""
    assert not tr.record("y", 1.0, 2.0).is_recording()
    assert tr.headers() == {}
    tc = common_pb2.TraceContext(traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    inject(span, tc)  # a client's context passes through untouched
    assert tc.traceparent == "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert set(threading.enumerate()) == before


def test_on_starts_one_exporter_thread_and_shutdown_stops_it():
    # nothing listens on the endpoint; nothing is exported in this test
    cfg = TelemetryConfig(otlp_traces_endpoint="127.0.0.1:9", trace_sample_ratio=1.0, enable_metrics=False)
    before = _otel_threads()
    tel = ServiceTelemetry(cfg, role="prefill", instance_id="p-1", cluster="c")
    assert tel.bus_headers_hook() is not None
    tel.start_tracing(epoch=1)
    assert tel.tracing.enabled
    assert len(_otel_threads() - before) == 1
    tel.tracing.shutdown()
    deadline = time.monotonic() + 5
    while _otel_threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _otel_threads() - before


def test_record_has_the_given_times_parent_and_resource(tracing):
    tr, exporter = tracing
    parent = tr.start_span("parent")
    t0 = time.monotonic()
    child = tr.record("child", t0 - 0.010, t0 - 0.004, {"k": 1}, parent=parent)
    add_event(parent, "mark", {"n": 2}, at=t0 - 0.002)
    tr.end(parent)
    spans = {s.name: s for s in _finished(tr, exporter)}
    c, p = spans["child"], spans["parent"]
    assert c.parent is not None and c.parent.span_id == p.context.span_id
    assert c.context.trace_id == p.context.trace_id
    assert c.end_time - c.start_time == pytest.approx(6_000_000, abs=50_000)  # 6 ms, as given
    assert abs(c.start_time - mono_ns(t0 - 0.010)) < 1_000_000
    assert c.attributes["k"] == 1
    assert p.events[0].name == "mark" and abs(p.events[0].timestamp - mono_ns(t0 - 0.002)) < 1_000_000
    res = p.resource.attributes
    assert res["service.name"] == "pdrelay-decode" and res["service.instance.id"] == "decode-7"
    assert res["pdrelay.epoch"] == 42 and res["pdrelay.cluster"] == "c1"
    assert child.is_recording() is False  # recorded spans are finished


def test_context_round_trips_through_messages_and_headers(tracing):
    tr, exporter = tracing
    client = tr.start_span("client")
    tc = common_pb2.TraceContext()
    inject(client, tc)
    sc = client.get_span_context()
    reference: dict[str, str] = {}  # what OpenTelemetry's own W3C propagator writes for the same span
    TraceContextTextMapPropagator().inject(reference, context=set_span_in_context(client))
    assert tc.traceparent == reference["traceparent"]
    assert tc.traceparent.startswith(f"00-{sc.trace_id:032x}-{sc.span_id:016x}-")
    server = tr.start_span("server", parent=extract(tc))
    token = tr.activate(server)
    headers = tr.headers()
    tr.deactivate(token)
    consumer = tr.start_span("consumer", parent=extract(headers))
    for s in (consumer, server, client):
        tr.end(s)
    got = {s.name: s for s in _finished(tr, exporter)}
    assert got["server"].parent.span_id == sc.span_id
    assert got["consumer"].parent.span_id == got["server"].context.span_id
    assert len({s.context.trace_id for s in got.values()}) == 1
    assert extract(common_pb2.TraceContext()) is None and extract({}) is None
    assert extract({"traceparent": "garbage"}) is None


def test_sample_ratio_zero_records_nothing_new_but_follows_a_sampled_caller():
    exporter = InMemorySpanExporter()
    tr = Tracing.start("unused:1", role="gateway", instance_id="g", cluster="c", sample_ratio=0.0, exporter=exporter)
    try:
        assert not tr.start_span("new root").is_recording()
        caller = extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        assert tr.start_span("follows", parent=caller).is_recording()
    finally:
        tr.shutdown()


@pytest.mark.parametrize("bad", ["localhost", "http://host", "host:port", ":4317"])
def test_malformed_endpoint_names_the_flag(bad):
    with pytest.raises(ValueError, match="--otlp-traces-endpoint"):
        check_endpoint(bad)
    assert check_endpoint("http://127.0.0.1:4317") == "http://127.0.0.1:4317"
