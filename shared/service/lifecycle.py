"""The lifecycle every pdrelay service shares: serve gRPC, register, warm up, announce ready, drain, exit 0.

    start     connect etcd and NATS (unreachable -> ControlPlaneUnavailable naming the URL; exit code 2)
              gRPC server (grpc.aio) on --host:--grpc-port (0 picks a free port; the real one is advertised),
              with the standard grpc.health.v1 service (NOT_SERVING until ready)
    register  etcd key under a lease, state "starting", a fresh epoch
    warm up   the subclass hook (load weights, capture graphs, ...)
    ready     health SERVING, state "ready", load reports every --load-report-interval-s, and the ready handshake:
              one JSON line on stdout (+ --ready-file) for the parent
    drain     on SIGTERM / SIGINT or a drain command on the bus: state "draining", health NOT_SERVING, new RPCs
              refused with UNAVAILABLE + a typed DRAINING error, in-flight work finishes (up to
              --drain-timeout-s; a second signal stops waiting), then deregister, stop the server, exit 0

A subclass overrides the hooks it needs: `add_servicers`, `warm_up`, `describe`, `load_snapshot`,
`on_draining`, `on_stop`, `on_epoch`. A role's `__main__` is then a few lines:

    def main(argv):
        cfg, opts = service_args("decode", argv)   # --resolved-config FILE (from `pdrelay up`) or raw flags
        return run_service(DecodeService(cfg, opts))
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc
from etcd3aio import Etcd3Client
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from shared.cluster.bus.admin_auth import AdminAuth, AdminAuthError
from shared.cluster.bus.client import Bus
from shared.cluster.bus.drain import DrainCommand, subscribe_drain
from shared.cluster.bus.load import LoadReporter, LoadSnapshot
from shared.cluster.drain_gate import DrainGate
from shared.cluster.errors import ControlPlaneUnavailable, StartupError
from shared.cluster.etcd import connect_etcd
from shared.cluster.handshake import ReadyInfo, announce_ready
from shared.cluster.instance import InstanceInfo, InstanceState, check_name
from shared.cluster.registration import Registrar
from shared.cluster.tls import TlsError, TlsFiles, listen
from shared.config.groups import BusConfig, DiscoveryConfig, GrpcConfig, TelemetryConfig, TlsConfig
from shared.config.resolved import ResolvedConfig
from shared.service.args import ServiceOptions, advertised_host, default_instance_id
from shared.telemetry.service import ServiceTelemetry

log = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class ServiceConfig:
    """The config groups the lifecycle reads; every role's resolved config has them (`ServiceConfig.of(cfg)`)."""

    discovery: DiscoveryConfig
    bus: BusConfig
    grpc: GrpcConfig
    telemetry: TelemetryConfig | None = None
    tls: TlsConfig | None = None

    @classmethod
    def of(cls, cfg: ResolvedConfig) -> ServiceConfig:
        return cls(cfg.discovery, cfg.bus, cfg.grpc, cfg.telemetry, cfg.tls)


class Service:
    """Base of every pdrelay service process. Subclasses set `role` and override hooks.

    `telemetry` (a TelemetryConfig) turns on /metrics on --metrics-port (advertised as metrics_address) and, with
    --otlp-traces-endpoint, tracing; `self.telemetry` (shared.telemetry.service) is what the request path uses.
    `tls` (a TlsConfig) with files: the gRPC server requires client certificates signed by the cluster CA, and
    etcd / NATS are reached with this service's certificate; `self.tls` is what the role's own channels use."""

    role: ClassVar[str] = ""
    # False: the service serves /metrics itself (the gateway, on its HTTP port) and describes its metrics_address.
    own_metrics_server: ClassVar[bool] = True

    def __init__(self, config: ServiceConfig, options: ServiceOptions = ServiceOptions()) -> None:
        assert self.role, f"{type(self).__name__} must set the class attribute `role`"
        discovery, bus, grpc_cfg, telemetry = config.discovery, config.bus, config.grpc, config.telemetry
        self._tls_cfg = config.tls
        self.tls: TlsFiles | None = None  # read at start (a bad file is a StartupError, exit 2)
        self.admin_auth: AdminAuth | None = None  # the cluster secret that signs admin commands (read at start)
        self.discovery_cfg, self.bus_cfg, self.grpc_cfg, self.options = discovery, bus, grpc_cfg, options
        self.cluster = discovery.cluster
        self.instance_id = discovery.instance_id or default_instance_id(self.role)
        check_name("instance id (--instance-id)", self.instance_id)
        check_name("cluster (--cluster)", self.cluster)
        self.gate = DrainGate(self.instance_id)
        self.health = HealthServicer()
        self.etcd: Etcd3Client | None = None
        self.bus: Bus | None = None
        self.registrar: Registrar | None = None
        self.server: grpc.aio.Server | None = None
        self.grpc_address = ""
        self.state = InstanceState.STARTING
        self.exit_code = 0
        self._health_names: list[str] = []
        self._drain_requested: asyncio.Event | None = None
        self._force_stop: asyncio.Event | None = None
        self._drain_reason = ""
        self._drain_timeout_s = options.drain_timeout_s
        self._load_reporter: LoadReporter | None = None
        self.telemetry = ServiceTelemetry(telemetry, role=self.role, instance_id=self.instance_id, cluster=self.cluster)

    # ------------------------------------------------------------------ hooks

    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        """Register the role's servicers; return their full names (e.g. "pdrelay.v1.Decode") for health."""
        return ()

    def server_interceptors(self) -> Sequence[grpc.aio.ServerInterceptor]:
        """Interceptors that run before the drain gate (e.g. the gateway's API key check)."""
        return ()

    def server_credentials(self) -> tuple[TlsFiles | None, bool]:
        """(TLS identity of the gRPC server, whether clients must present a certificate): the cluster's mutual
        TLS by default; the gateway's public API overrides it."""
        return self.tls, True

    async def warm_up(self) -> None:
        """Work between registration ("starting") and "ready": load weights, compile, capture graphs."""

    def describe(self) -> dict[str, Any]:
        """Extra InstanceInfo fields: model, kv_layout, capacity, transfer_backend/endpoint, metrics_address, ..."""
        return {}

    def load_snapshot(self) -> LoadSnapshot | None:
        """What the periodic load report says; None: this role sends no load reports."""
        return LoadSnapshot(running=self.gate.inflight)

    async def on_draining(self) -> None:
        """Draining began: stop admitting at the engine level (in-flight RPCs still finish)."""

    async def on_stop(self) -> None:
        """After the gRPC server stopped: free engine / transfer resources."""

    async def on_epoch(self, epoch: int) -> None:
        """Called with the epoch after every (re-)registration (fence work of the previous incarnation)."""

    # ------------------------------------------------------------------ control

    @property
    def epoch(self) -> int:
        return self.registrar.epoch if self.registrar is not None else 0

    def request_drain(self, reason: str = "", timeout_s: float | None = None) -> None:
        """Begin draining (idempotent); a second request while draining stops waiting for in-flight work."""
        if self._drain_requested is None:
            return
        if self._drain_requested.is_set():
            assert self._force_stop is not None
            if not self._force_stop.is_set():
                log.warning("%s: second stop request (%s): not waiting for in-flight work", self.instance_id, reason)
                self._force_stop.set()
            return
        self._drain_reason = reason
        if timeout_s:
            self._drain_timeout_s = timeout_s
        self._drain_requested.set()

    # ------------------------------------------------------------------ run

    async def run(self) -> int:
        self._drain_requested, self._force_stop = asyncio.Event(), asyncio.Event()
        try:
            await self._start()
            await self._drain_requested.wait()
            return await self._drain()
        finally:
            await self._close_clients()

    async def _start(self) -> None:
        opts = self.options
        try:
            self.tls = TlsFiles.from_config(self._tls_cfg)
        except TlsError as e:
            raise StartupError(str(e)) from None
        self.admin_auth = self._admin_auth()
        self.etcd = await connect_etcd(
            self.discovery_cfg.etcd_endpoints, timeout_s=opts.connect_timeout_s, tls=self.tls
        )
        self.bus = Bus.from_config(
            self.bus_cfg, name=self.instance_id, headers_hook=self.telemetry.bus_headers_hook(), tls=self.tls
        )
        await self.bus.connect(timeout_s=opts.connect_timeout_s)

        self.server = grpc.aio.server(interceptors=[*self.server_interceptors(), self.gate])
        self._health_names = ["", *self.add_servicers(self.server)]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        host, want = self.grpc_cfg.host, self.grpc_cfg.grpc_port
        try:
            creds, require_client_cert = self.server_credentials()
        except TlsError as e:
            raise StartupError(str(e)) from None
        try:
            port = listen(self.server, f"{host}:{want}", creds, require_client_cert=require_client_cert)
        except RuntimeError as e:
            raise StartupError(
                f"cannot listen on {host}:{want} (--host/--grpc-port): {e}; "
                "pick another port, or --grpc-port 0 for a free one"
            ) from None
        for name in self._health_names:
            await self.health.set(name, _NOT_SERVING)
        await self.server.start()
        self.grpc_address = f"{advertised_host(host)}:{port}"
        if self.own_metrics_server:
            await self._start_metrics(host)

        info = InstanceInfo(
            cluster=self.cluster,
            role=self.role,
            instance_id=self.instance_id,
            grpc_address=self.grpc_address,
            state=InstanceState.STARTING,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=time.time(),
            **self._description(),
        )
        self.registrar = Registrar(self.etcd, info, ttl_s=self.discovery_cfg.lease_ttl_s, on_epoch=self.on_epoch)
        await self.registrar.register()
        try:
            self.telemetry.start_tracing(self.epoch)
        except ValueError as e:  # a malformed --otlp-traces-endpoint
            raise StartupError(str(e)) from None
        await subscribe_drain(self.bus, self.cluster, self.instance_id, self._on_drain_command, auth=self.admin_auth)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_drain, sig.name)
        log.info("%s %s: gRPC on %s, epoch %d; warming up", self.role, self.instance_id, self.grpc_address, self.epoch)

        await self.warm_up()
        assert self._drain_requested is not None
        if self._drain_requested.is_set():
            return  # stopped during warm-up: never announce ready
        for name in self._health_names:
            await self.health.set(name, _SERVING)
        await self.registrar.set_state(InstanceState.READY)
        self.state = InstanceState.READY
        if self.load_snapshot() is not None:
            self._load_reporter = LoadReporter(
                self.bus,
                self.cluster,
                self.instance_id,
                self.role,
                self._snapshot_or_empty,
                interval_s=self.bus_cfg.load_report_interval_s,
                epoch=lambda: self.epoch,
            ).start()
        announce_ready(self.ready_info(), opts.ready_file)
        log.info("%s %s ready", self.role, self.instance_id)

    def _admin_auth(self) -> AdminAuth | None:
        """Drain commands must be signed with the cluster secret when --admin-secret-file is set."""
        path = getattr(self.bus_cfg, "admin_secret_file", None)
        if not path:
            log.info("%s: no --admin-secret-file: drain commands on the bus are not authenticated", self.instance_id)
            return None
        try:
            return AdminAuth.from_file(path)
        except AdminAuthError as e:
            raise StartupError(str(e)) from None

    async def _start_metrics(self, host: str) -> None:
        try:
            await self.telemetry.start_metrics(host, advertise_host=advertised_host(host))
        except OSError as e:
            assert self.telemetry.cfg is not None  # metrics bind only with a telemetry config
            raise StartupError(
                f"cannot serve /metrics on {host}:{self.telemetry.cfg.metrics_port} (--host/"
                f"--metrics-port): {e.strerror or e}; pick another port, or --metrics-port 0 for a "
                "free one"
            ) from None

    def _description(self) -> dict[str, Any]:
        """describe() plus what the lifecycle itself knows (the /metrics address)."""
        d = self.describe()
        if self.telemetry.metrics_address and not d.get("metrics_address"):
            d["metrics_address"] = self.telemetry.metrics_address
        return d

    def ready_info(self) -> ReadyInfo:
        d = self._description()
        return ReadyInfo(
            role=self.role,
            instance_id=self.instance_id,
            cluster=self.cluster,
            grpc=self.grpc_address,
            epoch=self.epoch,
            pid=os.getpid(),
            http=d.get("http_address", ""),
            metrics=d.get("metrics_address", ""),
        )

    def _snapshot_or_empty(self) -> LoadSnapshot:
        return self.load_snapshot() or LoadSnapshot()

    async def _on_drain_command(self, cmd: DrainCommand, meta: object) -> None:
        if cmd.instance_id != self.instance_id or (cmd.min_epoch and self.epoch > cmd.min_epoch):
            return  # meant for another instance, or for an older incarnation of this one
        log.info("%s: drain command received (%s)", self.instance_id, cmd.reason or "no reason given")
        self.request_drain(f"drain command: {cmd.reason}", cmd.timeout_s or None)

    async def _drain(self) -> int:
        assert self.registrar is not None and self.server is not None and self._force_stop is not None
        started = time.monotonic()
        log.info("%s: draining (%s), %d in flight", self.instance_id, self._drain_reason, self.gate.inflight)
        self.state = InstanceState.DRAINING
        self.gate.start_draining()
        await self.health.enter_graceful_shutdown()
        await self.registrar.set_state(InstanceState.DRAINING)
        await self.on_draining()
        idle = asyncio.ensure_future(self.gate.wait_idle(self._drain_timeout_s))
        forced = asyncio.ensure_future(self._force_stop.wait())
        await asyncio.wait({idle, forced}, return_when=asyncio.FIRST_COMPLETED)
        finished = idle.done() and idle.result()
        for f in (idle, forced):
            f.cancel()
        if not finished:
            log.warning(
                "%s: %d requests still in flight after %.1f s; stopping anyway",
                self.instance_id,
                self.gate.inflight,
                time.monotonic() - started,
            )
            self.exit_code = 1
        if self._load_reporter is not None:
            await self._load_reporter.close()
        await self.registrar.deregister()
        await self.server.stop(grace=0.5)
        await self.on_stop()
        log.info("%s: stopped after draining for %.2f s", self.instance_id, time.monotonic() - started)
        return self.exit_code

    async def _close_clients(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if self._load_reporter is not None:
            await self._load_reporter.close()
        if self.registrar is not None:
            await self.registrar.deregister()
        if self.server is not None:
            await self.server.stop(grace=None)
        if self.bus is not None:
            await self.bus.close()
        if self.etcd is not None:
            await self.etcd.close()
        await self.telemetry.close()  # last: spans of the shutdown itself are exported too


def run_service(service: Service) -> int:
    """Run to completion; an unreachable etcd/NATS or a bad port prints one clear line and exits 2."""
    try:
        return asyncio.run(service.run())
    except (ControlPlaneUnavailable, StartupError) as e:
        print(f"pdrelay {service.role}: {e}", file=sys.stderr)
        return 2
