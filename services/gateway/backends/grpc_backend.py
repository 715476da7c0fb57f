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
import logging
import time
from collections.abc import AsyncIterator, Collection, Sequence

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2_grpc
from services.gateway.backend import (
    BackendChunk,
    BackendError,
    BackendOverloaded,
    BackendRequest,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    RequestFailed,
)
from services.gateway.routing.breaker import BreakerBoard, BreakerConfig
from services.gateway.routing.channels import ChannelPool
from services.gateway.routing.discovery import Discovery, MembershipView
from services.gateway.routing.encoders import EncoderRouter
from services.gateway.routing.failures import FailureKind, Verdict, classify, classify_lost, classify_stream_end
from services.gateway.routing.kv_index import KVIndex, PromptHashes
from services.gateway.routing.media_affinity import MediaAffinity
from services.gateway.routing.policies import make_policy
from services.gateway.routing.router import NoRoute, NoRouteReason, Router
from services.gateway.routing.views import RoutePlan, RouteRequest
from services.gateway.routing.wire import chunk_from_pb, decode_request, remaining_max_tokens
from shared.cluster.bus.cancel import CancelReason, publish_cancel
from shared.cluster.bus.client import Bus
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.instance import InstanceInfo, InstanceState
from shared.cluster.tls import TlsFiles
from shared.telemetry import spans
from shared.telemetry.tracing import SpanKind, Tracing, add_event, current_span, inject, set_error

log = logging.getLogger(__name__)


def _route_attributes(
    plan: RoutePlan, policy: str, attempt: int, excluded: Collection[str], prompt_len: int
) -> dict[str, object]:
    """The gateway.route span's attributes: the chosen pair and why (policy, predicted cache hit, loads)."""
    d = plan.decode
    why = [
        f"{policy} policy, {plan.mode}",
        f"{d.role} {d.instance_id}: {d.load.running} running, "
        f"{d.load.free_pages}/{d.load.total_pages} pages free" + ("" if d.load.known else " (no load report)"),
    ]
    if plan.prefill is not None:
        p = plan.prefill
        why.append(f"prefill {p.instance_id}: {p.load.queued_prefill_tokens} queued prompt tokens")
    if plan.cached_tokens:
        why.append(f"{plan.cached_tokens} of {prompt_len} prompt tokens predicted cached")
    if excluded:
        why.append(f"excluded after failures: {', '.join(sorted(excluded))}")
    attrs: dict[str, object] = {
        spans.ROUTE_MODE: str(plan.mode),
        spans.ROUTE_DECODE: d.instance_id,
        spans.ROUTE_POLICY: policy,
        spans.ROUTE_CACHED_TOKENS: plan.cached_tokens,
        spans.ROUTE_REASON: "; ".join(why),
        spans.ATTEMPT: attempt,
    }
    if plan.prefill is not None:
        attrs[spans.ROUTE_PREFILL] = plan.prefill.instance_id
    return attrs


def _lost(info: InstanceInfo) -> bool:
    """An instance whose key vanished while it was not draining lost its lease: nobody will answer its calls."""
    return info.state != InstanceState.DRAINING


def _cancelled_by_us() -> bool:
    """Is the running task itself being cancelled (client gone, server shutting down)? A CancelledError raised while
    it is not comes from grpc: the call was cancelled locally because its channel was closed under it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


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
        prompt_len = len(req.prompt_token_ids)
        want_logprobs = req.sampling.logprobs is not None
        hashes = PromptHashes(req.prompt_token_ids, [(m.offset, m.num_tokens, m.media_hash) for m in req.media])
        sent: list[int] = []  # output tokens already handed to the client, over all attempts
        n = req.sampling.n
        done_samples: set[int] = set()  # n > 1: samples finished so far (the stream ends with the last one)
        streamed = False  # n > 1: some tokens went to the client (such a stream cannot be replayed)
        exclude: set[str] = set()
        verdicts: list[Verdict] = []
        failures = 0
        attempt = 0
        call: grpc.aio.UnaryStreamCall | None = None
        plans: list[RoutePlan] = []
        completed = False
        tr = self.tracing
        request_span = current_span()  # the HTTP layer's gateway.request (retries and migrations are its events)
        try:
            while True:
                left = remaining_max_tokens(req.sampling, len(sent))
                if left == 0:
                    # Every token was streamed; only the last message got lost with its instance.
                    completed = True
                    yield BackendChunk((), None, "length", None, prompt_len, None)
                    return
                route_req = RouteRequest(req.request_id, (*req.prompt_token_ids, *sent), left)
                t_route = time.monotonic()
                try:
                    plan = self.router.plan(
                        route_req, self.discovery.pools(req.model), exclude, hashes if not sent else None
                    )
                except NoRoute as e:
                    raise self._no_route_error(req, e, verdicts, bool(sent)) from None
                if tr.enabled:
                    policy = getattr(self.router.policy, "name", type(self.router.policy).__name__)
                    tr.record(
                        spans.GATEWAY_ROUTE,
                        t_route,
                        time.monotonic(),
                        _route_attributes(plan, policy, attempt, exclude, len(route_req.prompt_token_ids)),
                    )
                plans.append(plan)
                msg = decode_request(req, plan, sent, attempt)
                if msg.media and plan.prefill is not None:  # disaggregated: images go to encoders (EPD)
                    self.media_affinity.assign(msg.media, req.model)
                call_span = tr.start_span(
                    spans.GATEWAY_DECODE_CALL,
                    kind=SpanKind.CLIENT,
                    attributes={
                        spans.INSTANCE: plan.decode.instance_id,
                        spans.ATTEMPT: attempt,
                        spans.RPC_SYSTEM: "grpc",
                        spans.RPC_METHOD: "pdrelay.v1.Decode/Generate",
                        spans.SERVER_ADDRESS: plan.decode.grpc_address,
                    },
                )
                inject(call_span, msg.trace)  # decode's spans are children of this call
                channel = self.channels.get(plan.decode.instance_id, plan.decode.grpc_address)
                lease = self.router.begin(plan, len(msg.prompt_token_ids))
                started = False
                verdict: Verdict | None = None
                try:
                    call = worker_pb2_grpc.DecodeStub(channel).Generate(msg)
                    async for resp in call:
                        if resp.finish_reason == common_pb2.FINISH_REASON_ERROR:
                            verdict = classify(grpc.StatusCode.INTERNAL, resp.error, plan, started=started)
                            break
                        if not started and (resp.token_ids or resp.finish_reason):
                            started = True
                            lease.first_token()
                            add_event(call_span, spans.EVENT_FIRST_TOKEN)
                            self.router.succeeded(plan.instance_ids)
                        chunk = chunk_from_pb(
                            resp,
                            want_logprobs=want_logprobs,
                            num_prompt_tokens=prompt_len,
                            first=not sent and not streamed,
                        )
                        if n == 1:
                            sent.extend(chunk.token_ids)
                        streamed = streamed or bool(chunk.token_ids)
                        if chunk.finish_reason is not None:
                            done_samples.add(chunk.index)
                            completed = len(done_samples) >= n
                        if chunk.token_ids or chunk.finish_reason is not None:
                            yield chunk
                        if completed:
                            return
                    else:
                        verdict = classify_stream_end(plan)
                except grpc.aio.AioRpcError as e:
                    verdict = classify(e.code(), error_from_rpc(e), plan, details=e.details() or "", started=started)
                except asyncio.CancelledError:
                    if _cancelled_by_us():
                        raise
                    verdict = classify_lost(plan)
                finally:
                    lease.release()
                    if not completed and verdict is None:
                        self.router.abandoned(plan.instance_ids)  # closed by the client: no verdict on anyone
                    if verdict is not None:
                        set_error(call_span, verdict.message, {"pdrelay.failure": str(verdict.kind)})
                    tr.end(call_span)
                assert verdict is not None and call is not None
                call.cancel()  # a stream ended by an error message may still be open
                call = None
                self.router.failed(verdict.blame, plan.instance_ids)
                verdicts.append(verdict)
                log.warning(
                    "request %s attempt %d on %s failed (%s): %s",
                    req.request_id,
                    attempt,
                    plan.describe(),
                    verdict.kind,
                    verdict.message,
                )
                if not verdict.retryable:
                    raise self._final_error(verdict)
                if streamed and n > 1:
                    raise BackendUnavailable(
                        f"the stream of {n} samples broke after tokens were sent ({verdict.message});"
                        " n > 1 streams are not replayed, retry the request",
                        retry_after_s=self._retry_after_s,
                    )
                exclude |= verdict.exclude
                if verdict.uses_retry_budget:
                    failures += 1
                    if failures > self.request_retries:
                        raise BackendUnavailable(
                            f"request failed {failures} times (last on {plan.describe()}: {verdict.message}); "
                            f"the gateway retries {self.request_retries} times (--request-retries)",
                            retry_after_s=self._retry_after_s,
                        )
                    self.retries += 1
                    if sent:
                        self.replays += 1
                add_event(
                    request_span,
                    spans.EVENT_MIGRATION if sent else spans.EVENT_RETRY,
                    {
                        spans.ATTEMPT: attempt,
                        "pdrelay.failed_on": plan.describe(),
                        "pdrelay.failure": str(verdict.kind),
                        "pdrelay.error.message": verdict.message,
                        spans.OUTPUT_TOKENS: len(sent),
                    },
                )
                attempt += 1
        except (GeneratorExit, asyncio.CancelledError):
            # The client went away (or a stop string matched): stop every attempt's work, here and on NATS. A request
            # that completed is only being closed after its last chunk: nothing to stop anywhere.
            if plans and not completed:
                self._publish_cancel(req.request_id)
            raise
        finally:
            if call is not None:
                if completed:
                    self._reap(call)
                else:
                    call.cancel()

    # ------------------------------------------------------------------ errors

    def _no_route_error(self, req: BackendRequest, e: NoRoute, verdicts: list[Verdict], started: bool) -> BackendError:
        kinds = {v.kind for v in verdicts}
        if e.reason is NoRouteReason.EXCLUDED and FailureKind.OVERLOADED in kinds and not started:
            return BackendOverloaded(
                f"every instance serving {req.model!r} is at capacity ({verdicts[-1].message})",
                retry_after_s=self._retry_after_s,
            )
        detail = f"; last failure: {verdicts[-1].message}" if verdicts else ""
        if e.reason is NoRouteReason.NONE_READY:
            return BackendUnavailable(
                f"no instance serving {req.model!r} is ready ({e}){detail}", retry_after_s=self._retry_after_s
            )
        cooldown = self.router.breakers.config.cooldown_s
        return BackendUnavailable(
            f"{e}{detail}",
            retry_after_s=max(self._retry_after_s, cooldown)
            if e.reason is NoRouteReason.BREAKERS_OPEN
            else self._retry_after_s,
        )

    @staticmethod
    def _final_error(verdict: Verdict) -> BackendError:
        if verdict.kind == FailureKind.NOT_FOUND:
            return ModelNotFound(verdict.message)
        if verdict.kind == FailureKind.REQUEST:
            return RequestFailed(verdict.message)
        return InvalidRequest(verdict.message)

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
