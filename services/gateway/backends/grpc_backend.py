"""The routed gRPC backend: `GenerateBackend` over the cluster's decode / worker instances.

Per request: the router picks a plan (a decode + prefill pair, a colocated worker, or a decode that prefills
itself) from the ready instances, this module calls `Decode.Generate` on the plan's instance over a cached channel,
and turns the stream into BackendChunks. Then:

    refusal     overloaded / draining / a refused hand-off before any token: the instance (or the pair's prefill)
                is excluded and another plan is tried; refusals do not use the retry budget, and they end when
                every candidate has refused (-> 429 when one was overloaded, else 503, both with Retry-After)
    failure     unreachable, crashed, INTERNAL, a stream cut off: the circuit breaker of the blamed instance
                records it and the request is retried elsewhere, up to `request_retries` times
    replay      a failure after tokens were streamed: the next attempt's prompt is the original prompt + the tokens
                already sent, max_tokens shrinks by as many, so the client sees one continuous stream
    disconnect  the client went away (the generator is closed or its task cancelled): the gRPC call is cancelled
                (the worker aborts the request) and a NATS cancel goes to every instance that may hold work for it
    lost peer   the instance vanished from etcd without draining (lease expired: killed, hung, partitioned): its
                channel is closed at once, which cancels its calls locally; that is a server failure of the
                instance (replayed elsewhere), never a client disconnect, which only the caller's own
                cancellation or close is
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import grpc

from services.gateway.backend import BackendChunk, BackendRequest
from services.gateway.backends.attempt import Attempt, AttemptDeps
from services.gateway.backends.retry_loop import RetryLoop
from services.gateway.routing.breaker import BreakerBoard, BreakerConfig
from services.gateway.routing.channels import ChannelPool
from services.gateway.routing.discovery import Discovery, MembershipView
from services.gateway.routing.encoders import EncoderRouter
from services.gateway.routing.kv_index import KVIndex, PromptHashes
from services.gateway.routing.media_affinity import MediaAffinity
from services.gateway.routing.policies import make_policy
from services.gateway.routing.router import NoRoute, Router
from shared.cluster.bus.cancel import CancelReason, publish_cancel
from shared.cluster.bus.client import Bus
from shared.cluster.instance import InstanceInfo, InstanceState
from shared.cluster.tls import TlsFiles
from shared.telemetry import spans
from shared.telemetry.tracing import Tracing, add_event, current_span

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)


def _lost(info: InstanceInfo) -> bool:
    """An instance whose key vanished while it was not draining lost its lease: nobody will answer its calls."""
    return info.state != InstanceState.DRAINING


class GrpcBackend:
    """Implements services.gateway.backend.GenerateBackend. One event loop; not thread-safe.

    `tracing` (shared.telemetry.tracing) is off until the gateway service sets its process tracer."""

    def __init__(
        self,
        discovery: Discovery,
        *,
        models: Sequence[str],
        request_retries: int = 2,
        bus: Bus | None = None,
        cluster: str = "",
        origin: str = "gateway",
        channels: ChannelPool | None = None,
        retry_after_s: float = 1.0,
    ) -> None:
        if request_retries < 0:
            raise ValueError(f"request_retries must be >= 0 (got {request_retries}); try 2")
        if not models:
            raise ValueError("models is empty; pass the served model name(s) the gateway accepts")
        self.discovery = discovery
        self.router = discovery.router
        self._models = list(models)
        self.request_retries = request_retries
        self._bus = bus
        self._cluster = cluster
        self._origin = origin
        self.channels = channels if channels is not None else ChannelPool()
        self._retry_after_s = retry_after_s
        self.finish_grace_s = 5.0
        self.media_affinity = MediaAffinity(EncoderRouter(discovery.membership, discovery.loads))
        self._background: set[asyncio.Task[object]] = set()
        self.tracing = Tracing.off()
        self.retries = 0  # attempts after a failure (replays included), for metrics and tests
        self.replays = 0  # of which continued a stream that had already sent tokens
        self.cancels_published = 0

    @classmethod
    def create(
        cls,
        membership: MembershipView,
        *,
        models: Sequence[str],
        policy: str = "kv_aware",
        request_retries: int = 2,
        bus: Bus | None = None,
        cluster: str = "",
        origin: str = "gateway",
        breaker: BreakerConfig = BreakerConfig(),
        max_load_age_s: float = 2.0,
        tls: TlsFiles | None = None,
    ) -> GrpcBackend:
        """The backend over a started membership (and a connected bus for loads, KV events and cancels); `tls`:
        the cluster's mutual TLS on every channel to a worker."""
        router = Router(make_policy(policy), kv_index=KVIndex(), breakers=BreakerBoard(breaker))
        channels = ChannelPool(tls=tls)
        discovery = Discovery(
            membership,
            router,
            bus=bus,
            cluster=cluster,
            max_load_age_s=max_load_age_s,
            on_leave=lambda info: channels.discard(info.instance_id, lost=_lost(info)),
            on_join=lambda info: channels.revive(info.instance_id, info.grpc_address),
        )
        return cls(
            discovery,
            models=models,
            request_retries=request_retries,
            bus=bus,
            cluster=cluster,
            origin=origin,
            channels=channels,
        )

    # ------------------------------------------------------------------ GenerateBackend

    async def start(self) -> None:
        await self.discovery.start()

    async def close(self) -> None:
        try:
            await self.discovery.close()
            if self._background:
                await asyncio.wait(self._background, timeout=2.0)
            await self.channels.close()
        except Exception:  # close() must not raise (GenerateBackend contract)
            log.exception("closing the gRPC backend failed")

    async def ready(self) -> bool:
        return any(self.discovery.pools(m).servable for m in self._models)

    def models(self) -> list[str]:
        return [m for m in self._models if self.discovery.pools(m).servable]

    def generate(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        return self._generate(req)

    # ------------------------------------------------------------------ one request

    async def _generate(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        """The request's attempts (attempt.py) under its retry loop (retry_loop.py), until one completes or the loop
        gives up; a client that goes away cancels the attempt's call and every instance's work for it."""
        loop = RetryLoop(
            req,
            self.request_retries,
            retry_after_s=self._retry_after_s,
            breaker_cooldown_s=self.router.breakers.config.cooldown_s,
        )
        hashes = PromptHashes(req.prompt_token_ids, [(m.offset, m.num_tokens, m.media_hash) for m in req.media])
        deps = AttemptDeps(self.router, self.channels, self.media_affinity, self.tracing)
        request_span = current_span()  # the HTTP layer's gateway.request: retries and migrations are its events
        attempt: Attempt | None = None
        try:
            while True:
                route_req = loop.route_request()
                if route_req is None:  # every token was streamed; only the last message got lost with its instance
                    yield loop.final_chunk()
                    return
                t_route = time.monotonic()
                try:
                    plan = self.router.plan(
                        route_req, self.discovery.pools(req.model), loop.exclude, hashes if not loop.sent else None
                    )
                except NoRoute as e:
                    raise loop.no_route(e) from None
                attempt = Attempt(deps, loop, plan, t_route)
                async with contextlib.aclosing(attempt.run()) as chunks:
                    async for chunk in chunks:
                        yield chunk
                if loop.completed:
                    return
                self._after_failure(loop, attempt, request_span)
        except (GeneratorExit, asyncio.CancelledError):
            # The client went away (or a stop string matched): stop every attempt's work, here and on NATS. A request
            # that completed is only being closed after its last chunk: nothing to stop anywhere.
            if attempt is not None and not loop.completed:
                self._publish_cancel(req.request_id)
            raise
        finally:
            call = attempt.call if attempt is not None else None
            if call is not None:
                if loop.completed:
                    self._reap(call)
                else:
                    call.cancel()

    def _after_failure(self, loop: RetryLoop, attempt: Attempt, request_span: Span) -> None:
        """Count a failed attempt and record it on the request's span; raises the client's error when the loop
        gives up."""
        verdict, where = attempt.verdict, attempt.plan.describe()
        assert verdict is not None
        if loop.failed(verdict, where):
            self.retries += 1
            self.replays += bool(loop.sent)
        add_event(
            request_span,
            spans.EVENT_MIGRATION if loop.sent else spans.EVENT_RETRY,
            {
                spans.ATTEMPT: loop.attempt - 1,
                "pdrelay.failed_on": where,
                "pdrelay.failure": str(verdict.kind),
                "pdrelay.error.message": verdict.message,
                spans.OUTPUT_TOKENS: len(loop.sent),
            },
        )

    # ------------------------------------------------------------------ cancellation

    def _reap(self, call: grpc.aio.UnaryStreamCall) -> None:
        """The last message arrived: read the call's status so the RPC ends normally, and cancel it if the worker
        keeps the stream open for longer than `finish_grace_s` after its final message (its work is over)."""

        async def wait_status() -> None:
            try:
                await asyncio.wait_for(call.code(), self.finish_grace_s)
            except (TimeoutError, grpc.aio.AioRpcError):
                call.cancel()

        task: asyncio.Task[object] = asyncio.ensure_future(wait_status())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _publish_cancel(self, request_id: str) -> None:
        """Tell every instance holding work for the request (decode, its prefill, an older attempt) to drop it.
        Fire and forget: this runs while the caller's task is being closed or cancelled."""
        if self._bus is None or not self._cluster:
            return
        self.cancels_published += 1
        task: asyncio.Task[object] = asyncio.ensure_future(
            publish_cancel(
                self._bus, self._cluster, request_id, reason=CancelReason.CLIENT_DISCONNECTED, origin=self._origin
            )
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)
