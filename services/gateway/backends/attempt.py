"""Attempt: one try of a request on one routing plan.

    route      the plan the router chose, recorded as the gateway.route span (policy, pair, why)
    call       Decode.Generate on the plan's decode / worker over a cached channel, the request's images assigned
               to encoders first when the plan is a pair (EPD)
    translate  each stream message into a BackendChunk; a message with FINISH_REASON_ERROR, a gRPC error, a stream
               that ends without a finish reason, or a channel closed under the call (the instance lost its lease)
               ends the attempt with a `Verdict` (routing/failures.py) instead

The breakers and the router's in-flight counters hear about the attempt here; what to do after a failure is the
RetryLoop's business (retry_loop.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Collection
from dataclasses import dataclass

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2_grpc
from services.gateway.backend import BackendChunk
from services.gateway.backends.retry_loop import RetryLoop
from services.gateway.routing.channels import ChannelPool
from services.gateway.routing.failures import Verdict, classify, classify_lost, classify_stream_end
from services.gateway.routing.media_affinity import MediaAffinity
from services.gateway.routing.router import Router
from services.gateway.routing.views import RoutePlan
from services.gateway.routing.wire import chunk_from_pb, decode_request
from shared.cluster.grpc_errors import error_from_rpc
from shared.telemetry import spans
from shared.telemetry.tracing import SpanKind, Tracing, add_event, inject, set_error

log = logging.getLogger(__name__)


@dataclass
class AttemptDeps:
    """What an attempt uses of the backend: the router (leases, breakers), the channels, encoders, the tracer."""

    router: Router
    channels: ChannelPool
    media_affinity: MediaAffinity
    tracing: Tracing


def route_attributes(
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


def _cancelled_by_us() -> bool:
    """Is the running task itself being cancelled (client gone, server shutting down)? A CancelledError raised while
    it is not comes from grpc: the call was cancelled locally because its channel was closed under it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Attempt:
    """One try of `loop`'s request on `plan`. Iterate `run()` for its chunks; afterwards `verdict` says why it
    failed (None: it completed, or the client went away). `call` stays open until the owner reaps or cancels it."""

    def __init__(self, deps: AttemptDeps, loop: RetryLoop, plan: RoutePlan, t_route: float) -> None:
        self.deps, self.loop, self.plan = deps, loop, plan
        self.verdict: Verdict | None = None
        self.call: grpc.aio.UnaryStreamCall | None = None
        if deps.tracing.enabled:
            router = deps.router
            policy = getattr(router.policy, "name", type(router.policy).__name__)
            n_prompt = len(loop.req.prompt_token_ids) + len(loop.sent)
            attrs = route_attributes(plan, policy, loop.attempt, loop.exclude, n_prompt)
            deps.tracing.record(spans.GATEWAY_ROUTE, t_route, time.monotonic(), attrs)

    async def run(self) -> AsyncGenerator[BackendChunk, None]:
        deps, loop, plan = self.deps, self.loop, self.plan
        req = loop.req
        msg = decode_request(req, plan, loop.sent, loop.attempt)
        if msg.media and plan.prefill is not None:  # disaggregated: images go to encoders (EPD)
            deps.media_affinity.assign(msg.media, req.model)
        call_span = deps.tracing.start_span(
            spans.GATEWAY_DECODE_CALL,
            kind=SpanKind.CLIENT,
            attributes={
                spans.INSTANCE: plan.decode.instance_id,
                spans.ATTEMPT: loop.attempt,
                spans.RPC_SYSTEM: "grpc",
                spans.RPC_METHOD: "pdrelay.v1.Decode/Generate",
                spans.SERVER_ADDRESS: plan.decode.grpc_address,
            },
        )
        inject(call_span, msg.trace)  # decode's spans are children of this call
        channel = deps.channels.get(plan.decode.instance_id, plan.decode.grpc_address)
        lease = deps.router.begin(plan, len(msg.prompt_token_ids))
        started = False
        want_logprobs = req.sampling.logprobs is not None
        try:
            self.call = worker_pb2_grpc.DecodeStub(channel).Generate(msg)
            async for resp in self.call:
                if resp.finish_reason == common_pb2.FINISH_REASON_ERROR:
                    self.verdict = classify(grpc.StatusCode.INTERNAL, resp.error, plan, started=started)
                    break
                if not started and (resp.token_ids or resp.finish_reason):
                    started = True
                    lease.first_token()
                    add_event(call_span, spans.EVENT_FIRST_TOKEN)
                    deps.router.succeeded(plan.instance_ids)
                chunk = chunk_from_pb(
                    resp, want_logprobs=want_logprobs, num_prompt_tokens=len(req.prompt_token_ids), first=loop.first
                )
                loop.took(chunk)
                if chunk.token_ids or chunk.finish_reason is not None:
                    yield chunk
                if loop.completed:
                    return
            else:
                self.verdict = classify_stream_end(plan)
        except grpc.aio.AioRpcError as e:
            self.verdict = classify(e.code(), error_from_rpc(e), plan, details=e.details() or "", started=started)
        except asyncio.CancelledError:
            if _cancelled_by_us():
                raise
            self.verdict = classify_lost(plan)
        finally:
            lease.release()
            if not loop.completed and self.verdict is None:
                deps.router.abandoned(plan.instance_ids)  # closed by the client: no verdict on anyone
            if self.verdict is not None:
                set_error(call_span, self.verdict.message, {"pdrelay.failure": str(self.verdict.kind)})
            deps.tracing.end(call_span)
        self._failed()

    def _failed(self) -> None:
        """The attempt ended with a verdict: close its call and tell the breakers."""
        v = self.verdict
        assert v is not None and self.call is not None
        self.call.cancel()  # a stream ended by an error message may still be open
        self.call = None
        self.deps.router.failed(v.blame, self.plan.instance_ids)
        log.warning(
            "request %s attempt %d on %s failed (%s): %s",
            self.loop.req.request_id,
            self.loop.attempt,
            self.plan.describe(),
            v.kind,
            v.message,
        )
