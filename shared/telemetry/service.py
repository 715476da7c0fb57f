"""Telemetry of one service process: its tracer, its metrics registry and /metrics server, from TelemetryConfig.

The lifecycle (shared.service.lifecycle.Service) owns one `ServiceTelemetry`:

    start           `start_metrics()` before registration (the address goes into etcd as metrics_address and into
                    the ready line), `start_tracing(epoch)` right after it (the epoch is a resource attribute)
    request path    `tracing` (helpers that are no-ops when off), `metrics` (registry + request histograms),
                    `server_rpc(...)` for the server side of a request RPC
    NATS            `bus_headers_hook()`: the current trace context goes into every published message's headers
    stop            `close()`: flush buffered spans, stop the exporter thread and the /metrics server

A service without a telemetry config (e.g. the control-plane echo service) gets tracing off and no /metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from proto.pdrelay.v1 import common_pb2
from shared.config.groups import TelemetryConfig
from shared.telemetry.metrics import ServiceMetrics
from shared.telemetry.metrics_server import MetricsServer
from shared.telemetry.rpc import ServerRpc
from shared.telemetry.tracing import Tracing

log = logging.getLogger(__name__)


class ServiceTelemetry:
    def __init__(self, cfg: TelemetryConfig | None, *, role: str, instance_id: str, cluster: str) -> None:
        """cfg None: tracing off and no /metrics."""
        self.cfg = cfg
        self.role = role
        self.instance_id = instance_id
        self.cluster = cluster
        self.tracing = Tracing.off()
        self.metrics = ServiceMetrics()
        self.metrics_address = ""
        self._server: MetricsServer | None = None

    @property
    def endpoint(self) -> str | None:
        return (self.cfg.otlp_traces_endpoint or None) if self.cfg is not None else None

    @property
    def metrics_enabled(self) -> bool:
        return self.cfg is not None and self.cfg.enable_metrics

    # ---- tracing -------------------------------------------------------------------------------------------------
    def start_tracing(self, epoch: int) -> None:
        """Off unless --otlp-traces-endpoint is set; idempotent."""
        endpoint = self.endpoint
        if endpoint is None or self.cfg is None or self.tracing.enabled:
            return
        ratio = self.cfg.trace_sample_ratio
        self.tracing = Tracing.start(
            endpoint,
            role=self.role,
            instance_id=self.instance_id,
            cluster=self.cluster,
            epoch=epoch,
            sample_ratio=ratio,
        )
        log.info("%s: tracing to %s (sampling %.0f%%)", self.instance_id, endpoint, 100 * ratio)

    def bus_headers_hook(self) -> Callable[[], Mapping[str, str]] | None:
        """For shared.cluster.bus.client.Bus(headers_hook=...): None when tracing is off (no per-publish call)."""
        if self.endpoint is None:
            return None
        return lambda: self.tracing.headers()

    def server_rpc(
        self,
        name: str,
        carrier: common_pb2.TraceContext | None,
        context: grpc.aio.ServicerContext | None,
        request_id: str,
        attributes: Mapping[str, Any] | None = None,
    ) -> ServerRpc:
        return ServerRpc(self.tracing, self.metrics, self.instance_id, name, carrier, context, request_id, attributes)

    # ---- metrics -------------------------------------------------------------------------------------------------
    async def start_metrics(self, host: str, port: int | None = None, advertise_host: str | None = None) -> str:
        """Serve /metrics on host:port (default --metrics-port; 0: a free port); returns "host:port" ("" when
        metrics are off). OSError when the port cannot be bound."""
        if not self.metrics_enabled or self.cfg is None:
            return ""
        want = self.cfg.metrics_port if port is None else port
        server = MetricsServer(self.metrics.registry, host, want)
        bound = await server.start()
        self._server = server
        self.metrics_address = f"{advertise_host or host}:{bound}"
        return self.metrics_address

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()
            self._server = None
        if self.tracing.enabled:
            # flushing blocks on the exporter; keep the event loop (and the rest of the shutdown) going meanwhile
            await asyncio.to_thread(self.tracing.shutdown)
