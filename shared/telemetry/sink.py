"""A local trace sink: an OTLP/gRPC receiver that appends every span it gets as one JSON line to a file.

    python -m shared.telemetry.sink --out RUN_DIR/traces/spans.jsonl [--host 127.0.0.1] [--port 4317]

It is what `pdrelay up --trace` starts (no collector is needed for a local cluster), and the tests collect spans
with the same receiver in-process (`start_receiver(on_spans)`). Once listening it prints one JSON line on stdout,
`{"event": "trace-sink", "endpoint": "127.0.0.1:PORT", "out": FILE}`, then runs until SIGTERM / SIGINT.

Each line is a `SpanRecord`: ids in hex, times in epoch nanoseconds, attributes as JSON values, the service name
and instance id from the span's resource. `shared.telemetry.tree` reads the file back (`pdrelay trace`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import msgspec
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsg
from opentelemetry.proto.common.v1 import common_pb2 as otlp_common
from opentelemetry.proto.trace.v1 import trace_pb2

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}


class SpanEvent(msgspec.Struct, frozen=True):
    name: str
    time_ns: int
    attributes: dict[str, Any] = msgspec.field(default_factory=dict)


class SpanRecord(msgspec.Struct, frozen=True, kw_only=True):
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str = ""  # "" for a root span
    name: str
    kind: str = "internal"
    service: str = ""  # resource service.name, e.g. "pdrelay-decode"
    instance: str = ""  # resource service.instance.id
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = msgspec.field(default_factory=dict)
    events: list[SpanEvent] = msgspec.field(default_factory=list)
    status: str = "unset"  # unset | ok | error
    status_message: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _value(v: otlp_common.AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which) if which else None


def _attrs(kvs: Sequence[otlp_common.KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def records_of(request: ts.ExportTraceServiceRequest) -> list[SpanRecord]:
    """The spans of one OTLP export request."""
    out: list[SpanRecord] = []
    for rs in request.resource_spans:
        res = _attrs(rs.resource.attributes)
        service, instance = str(res.get("service.name", "")), str(res.get("service.instance.id", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(_record(s, service, instance))
    return out


def _record(s: trace_pb2.Span, service: str, instance: str) -> SpanRecord:
    return SpanRecord(
        trace_id=s.trace_id.hex(),
        span_id=s.span_id.hex(),
        parent_span_id=s.parent_span_id.hex(),
        name=s.name,
        kind=_KINDS.get(s.kind, str(s.kind)),
        service=service,
        instance=instance,
        start_ns=s.start_time_unix_nano,
        end_ns=s.end_time_unix_nano,
        attributes=_attrs(s.attributes),
        events=[SpanEvent(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events],
        status=_STATUS.get(s.status.code, str(s.status.code)),
        status_message=s.status.message,
    )


class Receiver(tsg.TraceServiceServicer):
    """OTLP TraceService.Export -> `on_spans(records)` (called from the gRPC thread pool; make it thread-safe)."""

    def __init__(self, on_spans: Callable[[list[SpanRecord]], None]) -> None:
        self.on_spans = on_spans

    def Export(
        self, request: ts.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ts.ExportTraceServiceResponse:
        self.on_spans(records_of(request))
        return ts.ExportTraceServiceResponse()


def start_receiver(
    on_spans: Callable[[list[SpanRecord]], None], host: str = "127.0.0.1", port: int = 0
) -> tuple[grpc.Server, int]:
    """A started OTLP/gRPC receiver (its own threads, independent of any event loop) and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="otlp-receiver"))
    tsg.add_TraceServiceServicer_to_server(Receiver(on_spans), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot listen on {host}:{port} for OTLP; pick another --port (0: a free one)")
    server.start()
    return server, bound


class SpanCollector:
    """Spans kept in memory (tests): `start()` -> endpoint; `spans()`; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[SpanRecord] = []
        self._server: grpc.Server | None = None
        self.endpoint = ""

    def start(self, host: str = "127.0.0.1") -> str:
        self._server, port = start_receiver(self._add, host)
        self.endpoint = f"{host}:{port}"
        return self.endpoint

    def _add(self, records: list[SpanRecord]) -> None:
        with self._lock:
            self._spans.extend(records)

    def spans(self) -> list[SpanRecord]:
        with self._lock:
            return list(self._spans)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None


class JsonlWriter:
    """Appends span records to a file, one JSON object per line, flushed after every export."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "ab")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self._enc = msgspec.json.Encoder()
        self.count = 0

    def __call__(self, records: list[SpanRecord]) -> None:
        data = b"".join(self._enc.encode(r) + b"\n" for r in records)
        with self._lock:
            self._f.write(data)
            self._f.flush()
            self.count += len(records)

    def close(self) -> None:
        with self._lock:
            self._f.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shared.telemetry.sink", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON-lines file the spans are appended to")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="OTLP/gRPC port (0: a free one)")
    ns = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    writer = JsonlWriter(Path(ns.out))
    try:
        server, port = start_receiver(writer, ns.host, ns.port)
    except (OSError, RuntimeError) as e:
        print(f"trace sink: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    line = {"event": "trace-sink", "endpoint": f"{ns.host}:{port}", "out": str(Path(ns.out).resolve())}
    sys.stdout.write(msgspec.json.encode(line).decode() + "\n")
    sys.stdout.flush()
    stop.wait()
    server.stop(2).wait(5)
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
