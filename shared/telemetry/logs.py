"""Service logs: the usual text lines, or one JSON object per line (--log-json) carrying trace and request ids.

    {"ts": "2026-12-01T10:00:00.123456Z", "level": "WARNING", "logger": "services.decode.remote_prefill",
     "message": "...", "service": "pdrelay-decode", "instance_id": "decode-1", "pid": 4242,
     "request_id": "chatcmpl-9f...", "trace_id": "4bf92f35...", "span_id": "00f067aa..."}

The request id is whatever the code handling a request bound with `bind_request_id` (a context variable, so it
follows the request's asyncio task); the trace and span ids are those of the current OpenTelemetry span, when
tracing is on and a span is current. A log line outside any request has neither.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import time
from typing import Any

import msgspec
from opentelemetry import trace

from shared.telemetry.tracing import service_name

_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("pdrelay_request_id", default="")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def bind_request_id(request_id: str) -> contextvars.Token[str]:
    """Log lines of this task carry `request_id` until `unbind_request_id(token)`."""
    return _REQUEST_ID.set(request_id)


def unbind_request_id(token: contextvars.Token[str]) -> None:
    try:
        _REQUEST_ID.reset(token)
    except ValueError:  # reset from another context (a generator closed elsewhere): nothing to undo here
        pass


def current_request_id() -> str:
    return _REQUEST_ID.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per record; `static` fields (service, instance id, pid) go into every line."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})
        self._enc = msgspec.json.Encoder()

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs * 1000):06d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self.static,
        }
        rid = _REQUEST_ID.get()
        if rid:
            out["request_id"] = rid
        sc = trace.get_current_span().get_span_context()
        if sc.is_valid:
            out["trace_id"] = f"{sc.trace_id:032x}"
            out["span_id"] = f"{sc.span_id:016x}"
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return self._enc.encode(out).decode()


def setup_logging(telemetry: Any, *, role: str, instance_id: str) -> None:
    """Configure the root logger of a service process from its TelemetryConfig (log_level, log_json)."""
    handler = logging.StreamHandler(sys.stderr)
    if getattr(telemetry, "log_json", False):
        handler.setFormatter(
            JsonFormatter({"service": service_name(role), "instance_id": instance_id, "pid": os.getpid()})
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=str(getattr(telemetry, "log_level", "info")).upper(), handlers=[handler], force=True)
