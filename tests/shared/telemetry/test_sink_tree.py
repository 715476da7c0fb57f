"""The OTLP receiver turns exported spans into records (ids, times, resource, attributes, events, status), the
JSON-lines file round-trips, and the tree / TTFT breakdown of a trace is what the spans say."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from shared.telemetry import spans as names
from shared.telemetry.sink import JsonlWriter, SpanCollector, SpanEvent, SpanRecord, start_receiver
from shared.telemetry.tracing import SpanKind, Tracing, add_event, set_error
from shared.telemetry.tree import breakdown, by_trace, load, render, requests, traces_of_request


def _wait_for(collector: SpanCollector, n: int, timeout: float = 5.0) -> list[SpanRecord]:
    deadline = time.monotonic() + timeout
    while len(collector.spans()) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return collector.spans()


def test_receiver_records_what_the_exporter_sent():
    collector = SpanCollector()
    endpoint = collector.start()
    tr = Tracing.start(f"http://{endpoint}", role="prefill", instance_id="prefill-3", cluster="c", epoch=9)
    try:
        t0 = time.monotonic()
        parent = tr.start_span("outer", kind=SpanKind.SERVER, start=t0, attributes={"pdrelay.request_id": "r-1"})
        tr.record("inner", t0 + 0.001, t0 + 0.003, {"n": 7, "f": 0.5, "ok": True, "s": "x", "l": [1, 2]}, parent=parent)
        add_event(parent, "first_token", {"k": "v"}, at=t0 + 0.002)
        set_error(parent, "it broke", {"pdrelay.error.code": "internal"})
        tr.end(parent, t0 + 0.004)
    finally:
        tr.shutdown()  # flushes
    got = {s.name: s for s in _wait_for(collector, 2)}
    collector.stop()
    outer, inner = got["outer"], got["inner"]
    assert outer.service == "pdrelay-prefill" and outer.instance == "prefill-3" and outer.kind == "server"
    assert inner.parent_span_id == outer.span_id and inner.trace_id == outer.trace_id and outer.parent_span_id == ""
    assert len(outer.trace_id) == 32 and len(outer.span_id) == 16
    assert inner.attributes == {"n": 7, "f": 0.5, "ok": True, "s": "x", "l": [1, 2]}
    assert inner.duration_ns == pytest.approx(2_000_000, abs=20_000)
    assert outer.events == [SpanEvent("first_token", outer.events[0].time_ns, {"k": "v"})]
    assert outer.events[0].time_ns - outer.start_ns == pytest.approx(2_000_000, abs=20_000)
    assert outer.status == "error" and outer.status_message == "it broke"


def test_jsonl_round_trip(tmp_path: Path):
    path = tmp_path / "t" / "spans.jsonl"
    writer = JsonlWriter(path)
    server, port = start_receiver(writer)
    tr = Tracing.start(f"127.0.0.1:{port}", role="gateway", instance_id="g", cluster="c")
    try:
        for i in range(3):
            tr.record(f"s{i}", time.monotonic() - 0.01, time.monotonic(), {"pdrelay.request_id": f"r{i}"})
    finally:
        tr.shutdown()
        server.stop(0).wait(5)
        writer.close()
    with open(path, "ab") as f:
        f.write(b'{"torn": ')  # a half-written last line is skipped
    records = load(path)
    assert sorted(r.name for r in records) == ["s0", "s1", "s2"] and writer.count == 3
    assert traces_of_request(records, "r1") == [next(r.trace_id for r in records if r.name == "s1")]


def _span(name: str, sid: str, parent: str, start_ms: float, end_ms: float, **attrs: object) -> SpanRecord:
    return SpanRecord(
        trace_id="t" * 32,
        span_id=sid,
        parent_span_id=parent,
        name=name,
        service="pdrelay-x",
        instance="x-1",
        start_ns=int(start_ms * 1e6),
        end_ns=int(end_ms * 1e6),
        attributes=dict(attrs),
    )


def _example() -> list[SpanRecord]:
    root = _span(names.GATEWAY_REQUEST, "r", "", 0, 100, **{names.REQUEST_ID: "req-1"})
    root = SpanRecord(
        **{
            **{f: getattr(root, f) for f in root.__struct_fields__},
            "events": [SpanEvent(names.EVENT_FIRST_TOKEN, int(60e6))],
        }
    )
    return [
        root,
        _span("a", "A", "r", 0, 10),  # leaf
        _span("call", "B", "r", 10, 90),  # a client call ...
        _span("server", "C", "B", 15, 85),  # ... its server side
        _span("d", "D", "C", 20, 40),  # leaves inside the server
        _span("e", "E", "C", 40, 50),
        _span("late", "F", "C", 70, 80),
    ]  # after the first token: not part of TTFT


def test_breakdown_charges_every_instant_to_the_deepest_span():
    bd = breakdown(_example())
    assert bd is not None
    assert bd.ttft_ns == 60_000_000
    # by hand: a [0,10]; call's own [10,15]; server's own [15,20] + [50,60]; d [20,40]; e [40,50]
    assert {(n, leaf): ns / 1e6 for n, ns, leaf in bd.parts} == {
        ("a", True): 10,
        ("call", False): 5,
        ("server", False): 15,
        ("d", True): 20,
        ("e", True): 10,
    }
    assert bd.coverage == pytest.approx(40 / 60)
    assert sum(ns for _, ns, _ in bd.parts) == bd.ttft_ns


def test_breakdown_needs_the_gateway_root_and_its_first_token():
    trace = _example()
    assert breakdown(trace[1:]) is None  # no gateway.request
    no_event = [
        SpanRecord(**{**{f: getattr(trace[0], f) for f in trace[0].__struct_fields__}, "events": []}),
        *trace[1:],
    ]
    assert breakdown(no_event) is None


def test_render_and_request_listing():
    trace = _example()
    text = render(trace, "req-1")
    lines = text.splitlines()
    assert lines[0].startswith(f"trace {'t' * 32}  request req-1  total 100.00 ms  TTFT 60.00 ms")
    order = [m.group(1) for ln in lines[2:] if (m := re.match(r"\s*\+[\d.]+ ms\s+[\d.]+ ms\s+(?:\|- )?(\S+)", ln))]
    assert order == [names.GATEWAY_REQUEST, "a", "call", "server", "d", "e", "late"]  # depth-first, by start
    indent = {n: next(ln for ln in lines if f" {n}  [" in ln).index(f" {n}  [") for n in ("a", "call", "server", "d")}
    assert indent["a"] == indent["call"] < indent["server"] < indent["d"]
    assert "* first_token at +60.00 ms" in text
    assert "TTFT 60.00 ms = d 20.00 (33%), server (self) 15.00 (25%), a 10.00 (17%)" in text
    rows = requests(trace)
    assert [(r.request_id, r.ttft_ns, r.num_spans, r.error) for r in rows] == [("req-1", 60_000_000, 7, False)]
    assert list(by_trace(trace)) == ["t" * 32]
