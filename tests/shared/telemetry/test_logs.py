"""JSON logs carry the request id bound by the request's code and the current span's trace and span ids."""

from __future__ import annotations

import json
import logging

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.telemetry.logs import JsonFormatter, bind_request_id, current_request_id, setup_logging, unbind_request_id
from shared.telemetry.tracing import Tracing


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("pdrelay.test", logging.WARNING, __file__, 1, msg, (), None)


def test_json_lines_carry_request_and_trace_ids():
    fmt = JsonFormatter({"service": "pdrelay-decode", "instance_id": "decode-1"})
    plain = json.loads(fmt.format(_record("outside")))
    assert plain["message"] == "outside" and plain["level"] == "WARNING" and plain["service"] == "pdrelay-decode"
    assert "request_id" not in plain and "trace_id" not in plain
    tr = Tracing.start("unused:1", role="decode", instance_id="decode-1", cluster="c", exporter=InMemorySpanExporter())
    try:
        span = tr.start_span("work")
        token = tr.activate(span)
        rid = bind_request_id("chatcmpl-42")
        try:
            assert current_request_id() == "chatcmpl-42"
            inside = json.loads(fmt.format(_record("inside 1")))
        finally:
            unbind_request_id(rid)
            tr.deactivate(token)
            tr.end(span)
        sc = span.get_span_context()
        assert inside["request_id"] == "chatcmpl-42"
        assert inside["trace_id"] == f"{sc.trace_id:032x}" and inside["span_id"] == f"{sc.span_id:016x}"
        assert current_request_id() == ""
    finally:
        tr.shutdown()


def test_setup_logging_picks_the_format_from_the_config():
    class Cfg:
        log_level = "warning"
        log_json = True

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging(Cfg(), role="prefill", instance_id="prefill-2")
        assert root.level == logging.WARNING
        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        assert handler.formatter.static["service"] == "pdrelay-prefill"
        assert handler.formatter.static["instance_id"] == "prefill-2"
        Cfg.log_json = False
        setup_logging(Cfg(), role="prefill", instance_id="prefill-2")
        assert not isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
