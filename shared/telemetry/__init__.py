"""Observability: OpenTelemetry traces across every hop, Prometheus metrics, structured logs.

    tracing.py         the tracer of a process (off by default: a no-op tracer, no threads), W3C propagation
    spans.py           span / event / attribute names (stable; the trace tree of a request is drawn there)
    service.py         ServiceTelemetry: what the service lifecycle owns (tracer, registry, /metrics server)
    rpc.py             the server side of a request RPC: span, request id for logs, errors by code, token timing
    metrics.py         the compute services' metrics (request histograms, engine, KV transfer)
    metrics_server.py  GET /metrics on --metrics-port, on the service's event loop
    logs.py            text or JSON logs (--log-json) with trace and request ids
    sink.py            an OTLP/gRPC receiver writing spans as JSON lines (`pdrelay up --trace`, tests)
    tree.py            spans -> one request's tree and TTFT breakdown (`pdrelay trace`)

Import the submodules directly; this package imports nothing on its own.
"""
