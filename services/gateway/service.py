"""The gateway service: the OpenAI HTTP API and the gRPC Gateway API over the routed gRPC backend.

It is a lifecycle Service (shared.service.lifecycle) of role "gateway", so it registers in etcd (with its HTTP
address, which `pdrelay status` and the ready line show), answers grpc.health.v1, and drains on SIGTERM:

    warm up   tokenizer, etcd membership watch, load table + KV index over NATS, HTTP server (uvicorn on this
              event loop) and the gRPC API; the registration is updated with the HTTP address, then "ready"
    drain     the HTTP listener closes and new requests on open connections get 503 + Retry-After; HTTP requests
              and gRPC streams in flight are counted by the lifecycle's drain gate, which waits for them (up to
              --drain-timeout-s), then the backend closes
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator, Sequence
from typing import Any

import grpc

from proto.pdrelay.v1 import gateway_pb2_grpc
from services.gateway.backends.grpc_backend import GrpcBackend
from services.gateway.backends.grpc_metrics import BackendCollector
from services.gateway.grpc.api import ApiContext, GatewayApi
from services.gateway.grpc.auth import ApiKeyInterceptor
from services.gateway.http.app import GatewayApp
from services.gateway.http.asgi import Receive, Scope, Send
from services.gateway.http.embeddings import Embeddings, mount_embeddings
from services.gateway.openai.errors import ApiError
from services.gateway.public_tls import public_tls, uvicorn_ssl_args
from services.gateway.routing.kv_sync import index_status
from services.gateway.server import build_app, load_tokenizer, served_names_of
from shared.cluster.bus.kv_index_status import serve_kv_index_status
from shared.cluster.bus.load import LoadSnapshot
from shared.cluster.errors import StartupError
from shared.cluster.membership import Membership
from shared.cluster.tls import TlsFiles
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role
from shared.service import Service, ServiceConfig, ServiceOptions, advertised_host

log = logging.getLogger(__name__)

# How long a starting gateway waits for the instances' KV snapshots before it turns ready: a restarted gateway then
# routes its first requests to the caches that hold their prefixes (an instance that does not answer is routed by
# load until it does).
KV_INDEX_SETTLE_S = 3.0


def _embedded_server_class() -> type:
    import uvicorn

    class EmbeddedServer(uvicorn.Server):
        """uvicorn on an event loop it does not own: the lifecycle handles SIGTERM/SIGINT, not uvicorn."""

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield

    return EmbeddedServer


class _DrainGateMiddleware:
    """Counts every HTTP request in the lifecycle's drain gate, and refuses new ones once draining."""

    def __init__(self, app: GatewayApp, svc: GatewayService) -> None:
        self.app = app
        self.svc = svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate = self.svc.gate
        if gate.draining:
            err = ApiError(
                503,
                f"gateway {self.svc.instance_id} is shutting down; retry on another gateway",
                code="draining",
                retry_after_s=1,
            )
            body = err.body()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                        *err.headers,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        async with gate.hold():
            await self.app(scope, receive, send)


class GatewayService(Service):
    role = Role.GATEWAY
    own_metrics_server = False  # /metrics is on the HTTP port (metrics_address = http_address)

    def __init__(self, cfg: ResolvedConfig, options: ServiceOptions = ServiceOptions()) -> None:
        super().__init__(ServiceConfig.of(cfg), options)
        self.cfg = cfg
        self.api = GatewayApi()
        self.membership: Membership | None = None
        self.backend: GrpcBackend | None = None
        self.app: GatewayApp | None = None
        self.http_address = ""
        self.embeddings: Embeddings | None = None
        self._http: Any = None  # the uvicorn server
        self._http_task: asyncio.Task[None] | None = None
        self._kv_status: Any = None  # the NATS subscription answering `pdrelay status`

    # ---- lifecycle hooks ---------------------------------------------------------------------------------------
    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        gateway_pb2_grpc.add_GatewayServicer_to_server(self.api, server)
        return ("pdrelay.v1.Gateway",)

    def server_interceptors(self) -> Sequence[grpc.aio.ServerInterceptor]:
        key = self.cfg.http.api_key
        return (ApiKeyInterceptor(key),) if key else ()

    def server_credentials(self) -> tuple[TlsFiles | None, bool]:
        # The gRPC API is the public front door, like HTTP: the --ssl-* certificate, client certificates only when
        # --ssl-ca-certs asks for them. Without --ssl-*, the cluster's mutual TLS (if any) applies.
        public = public_tls(self.cfg.http)
        if public is not None:
            return public, self.cfg.http.ssl_ca_certs is not None
        return self.tls, True

    def describe(self) -> dict[str, Any]:
        primary, _ = served_names_of(self.cfg)
        d: dict[str, Any] = {"model": primary}
        if self.http_address:
            d["http_address"] = self.http_address
            if self.telemetry.metrics_enabled:
                d["metrics_address"] = self.http_address
        return d

    def load_snapshot(self) -> LoadSnapshot | None:
        return None  # nothing routes to gateways by load

    async def warm_up(self) -> None:
        cfg = self.cfg
        tokenizer = await asyncio.to_thread(load_tokenizer, cfg)
        assert self.etcd is not None and self.bus is not None
        self.membership = Membership(self.etcd, self.cluster)
        await self.membership.start()
        primary, aliases = served_names_of(cfg)
        self.backend = GrpcBackend.create(
            self.membership,
            models=[primary],
            policy=cfg.http.routing_policy,
            request_retries=cfg.http.request_retries,
            bus=self.bus,
            cluster=self.cluster,
            origin=self.instance_id,
            tls=self.tls,
        )
        self.backend.tracing = self.telemetry.tracing
        await self.backend.start()
        kv_index = self.backend.router.kv_index
        if not await self.backend.discovery.settle(KV_INDEX_SETTLE_S):
            log.warning("gateway %s: KV snapshots still pending after %.0f s", self.instance_id, KV_INDEX_SETTLE_S)
        self._kv_status = await serve_kv_index_status(
            self.bus, self.cluster, self.instance_id, lambda: index_status(kv_index, self.instance_id)
        )
        self.app = build_app(cfg, self.backend, tokenizer=tokenizer)
        self.app.tracing = self.telemetry.tracing
        self.app.metrics.registry.register(BackendCollector(self.backend))
        self.embeddings = mount_embeddings(self.app, self.membership, self.backend.discovery.loads, cfg.http, self.tls)
        self.api.attach(
            ApiContext(
                backend=self.backend,
                tokenizer=tokenizer,
                served_model_names=(primary,),
                aliases=tuple(aliases),
                model_root=cfg.model.model,
                metrics=self.app.metrics,
                membership=self.membership,
                instance_id=self.instance_id,
                embeddings=self.embeddings,
            )
        )
        await self._start_http(self.app)
        assert self.registrar is not None
        await self.registrar.update(**self.describe())
        log.info(
            "gateway %s: HTTP on %s, gRPC API on %s, routing %s, %d instances known",
            self.instance_id,
            self.http_address,
            self.grpc_address,
            cfg.http.routing_policy,
            len(self.membership.instances()),
        )

    async def _start_http(self, app: GatewayApp) -> None:
        import uvicorn

        cfg = self.cfg
        level = cfg.telemetry.log_level
        # lifespan off: the service starts and closes the backend itself (the gRPC API shares it).
        config = uvicorn.Config(
            _DrainGateMiddleware(app, self),
            host=cfg.grpc.host,
            port=cfg.http.port,
            access_log=False,
            log_level=level,
            log_config=None,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=max(1, int(self.options.drain_timeout_s)),
            **uvicorn_ssl_args(cfg.http),
        )
        server = _embedded_server_class()(config)
        self._http = server

        async def serve() -> None:
            try:
                await server.serve()
            except SystemExit:  # uvicorn exits the process when it cannot bind; we report it instead
                pass

        self._http_task = asyncio.create_task(serve(), name="gateway-http")
        while not server.started:
            if self._http_task.done():
                self._http = None
                raise StartupError(
                    f"cannot serve HTTP on {cfg.grpc.host}:{cfg.http.port} (--host/--port; see the "
                    "error above); pick another port, or --port 0 for a free one"
                )
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.http_address = f"{advertised_host(cfg.grpc.host)}:{port}"

    async def on_draining(self) -> None:
        # Stop listening; open connections finish their requests (the drain gate counts them) and then close.
        if self._http is not None:
            self._http.should_exit = True

    async def on_stop(self) -> None:
        await self._stop_http()
        if self._kv_status is not None:
            with contextlib.suppress(Exception):  # NATS already closed
                await self._kv_status.unsubscribe()
        backend, membership, self.backend, self.membership = self.backend, self.membership, None, None
        if self.embeddings is not None:
            await self.embeddings.backend.close()
        if backend is not None:
            await backend.close()
        if membership is not None:
            await membership.close()

    async def _stop_http(self) -> None:
        if self._http is None or self._http_task is None:
            return
        self._http.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._http_task), 2.0)
        except (TimeoutError, SystemExit):
            self._http.force_exit = True
            self._http_task.cancel()
        except Exception:  # the HTTP server failing on the way out must not stop the rest of the shutdown
            log.exception("HTTP server failed while stopping")
        self._http = None
