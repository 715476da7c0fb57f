"""Decode.Generate: admit a request, get its prompt KV (locally or from a prefill instance), stream token deltas.

The worker role (colocated) always prefills locally. The decode role hands the prompt to the prefill instance the
gateway picked, unless the prompt is shorter than --local-prefill-threshold or no prefill target was given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from shared.cluster.grpc_errors import abort, make_error
from shared.cluster.sampling_pb import sampling_from_pb
from shared.engine.errors import EngineError, InvalidRequest, QueueFull, RequestFailed
from shared.engine.request import MediaInput, RequestOutput
from shared.modelspec.sampling import SamplingParams
from shared.serving.convert import finish_to_pb, logprob_to_pb, matched_stop_to_pb
from shared.telemetry import spans
from shared.telemetry.rpc import TokenTimer

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from shared.serving.engine_service import EngineService

log = logging.getLogger(__name__)


class RemotePrefill(Protocol):
    """The decode role's hand-off: returns the request's deltas once its prompt KV is in decode's pages."""

    def wants(self, request: worker_pb2.DecodeRequest) -> bool: ...

    def run(
        self, request: worker_pb2.DecodeRequest, rid: str, params: SamplingParams, head: worker_pb2.DecodeResponse
    ) -> AsyncIterator[RequestOutput]:
        """`head`: fields only the first response carries (timings, prefill_instance_id), filled in by run()."""
        ...


class HandoffFailed(EngineError):
    """The prompt KV could not be obtained from any prefill instance; `code` is the pdrelay ErrorCode."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class DecodeServicer(worker_pb2_grpc.DecodeServicer):
    def __init__(self, svc: EngineService, remote: RemotePrefill | None = None) -> None:
        self.svc = svc
        self.remote = remote
        svc.telemetry.metrics.requests  # noqa: B018 - the TTFT / ITL / e2e histograms exist (at zero) before the first request

    async def Generate(
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.DecodeResponse]:
        """The stream of `_generate`, observed: the decode.generate span (child of request.trace), TTFT / ITL / e2e
        histograms, errors by code, the request id in the logs."""
        svc = self.svc
        tel = svc.telemetry
        timer = TokenTimer(tel.metrics.requests)
        attrs = {
            spans.ATTEMPT: request.attempt,
            spans.EPOCH: svc.epoch,
            spans.PROMPT_TOKENS: len(request.prompt_token_ids),
        }
        with tel.server_rpc(spans.DECODE_GENERATE, request.trace, context, request.request_id, attrs) as rpc:
            first = last = None
            try:
                async for msg in self._generate(request, context):
                    timer.on_tokens(len(msg.token_ids))
                    if msg.HasField("error"):
                        rpc.fail(msg.error.code, msg.error.message)
                    if first is None:
                        first = msg
                    last = msg
                    yield msg
                if last is not None and last.finish_reason != common_pb2.FINISH_REASON_ERROR:
                    timer.finished()
            finally:
                if rpc.span is not None and rpc.span.is_recording():
                    self._record_spans(rpc.span, timer, first, last)

    def _record_spans(
        self,
        span: Span,
        timer: TokenTimer,
        first: worker_pb2.DecodeResponse | None,
        last: worker_pb2.DecodeResponse | None,
    ) -> None:
        tr = self.svc.telemetry.tracing
        if first is not None and last is not None:
            span.set_attributes(
                {
                    spans.OUTPUT_TOKENS: timer.tokens,
                    spans.CACHED_TOKENS: last.usage.cached_tokens,
                    spans.FINISH_REASON: common_pb2.FinishReason.Name(last.finish_reason)
                    .lower()
                    .removeprefix("finish_reason_"),
                }
            )
            if first.prefill_instance_id:
                span.set_attribute(spans.PREFILL_INSTANCE, first.prefill_instance_id)
            elif timer.first_at is not None:  # prefilled here: queue wait and compute in one phase
                tr.record(
                    spans.DECODE_PREFILL,
                    timer.start,
                    timer.first_at,
                    {spans.PROMPT_TOKENS: last.usage.prompt_tokens, spans.CACHED_TOKENS: last.usage.cached_tokens},
                    parent=span,
                )
        if timer.first_at is not None and timer.last_at is not None:
            tr.record(
                spans.DECODE_STREAM, timer.first_at, timer.last_at, {spans.OUTPUT_TOKENS: timer.tokens}, parent=span
            )

    async def _generate(
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.DecodeResponse]:
        svc = self.svc
        params = await self._checked_params(request, context)
        rid = svc.ids.open(request.request_id, request.attempt)
        t0 = time.monotonic()
        head = worker_pb2.DecodeResponse()  # what only the first message carries
        try:
            stream = await self._stream(request, rid, params, head)
            first = True
            num_out: dict[int, int] = {}  # per sample (n > 1)
            out_ids: dict[int, list[int]] = {}  # per sample: what the kvstore keeps of a finished conversation
            async for out in stream:
                num_out[out.index] = num_out.get(out.index, 0) + len(out.new_token_ids)
                out_ids.setdefault(out.index, []).extend(out.new_token_ids)
                msg = _message(request.request_id, out, num_out[out.index])
                if first:
                    if not head.timings.prefill_s:
                        head.timings.prefill_s = time.monotonic() - t0
                    msg.timings.CopyFrom(head.timings)
                    msg.prefill_instance_id = head.prefill_instance_id
                    first = False
                if out.finished:
                    self._store_conversation(request, out, out_ids[out.index])
                yield msg
        except InvalidRequest as e:
            await abort(context, common_pb2.ERROR_CODE_INVALID_ARGUMENT, str(e), instance_id=svc.instance_id)
        except QueueFull as e:
            await abort(context, common_pb2.ERROR_CODE_OVERLOADED, str(e), instance_id=svc.instance_id)
        except HandoffFailed as e:
            await abort(context, e.code, str(e), instance_id=svc.instance_id)
        except RequestFailed as e:
            # The request's own failure (its logits processing, grammar, detokenizing): the batch and this instance
            # are fine, so the gateway neither retries it nor holds it against this instance's breaker.
            log.warning("%s: request %s failed alone: %s", svc.instance_id, rid, e)
            yield worker_pb2.DecodeResponse(
                request_id=request.request_id,
                finish_reason=common_pb2.FINISH_REASON_ERROR,
                error=make_error(
                    common_pb2.ERROR_CODE_REQUEST_FAILED,
                    f"the request failed on {svc.instance_id}: {e}",
                    instance_id=svc.instance_id,
                    retryable=False,
                ),
            )
        except EngineError as e:
            # Mid-stream engine failure: end the stream with a typed error the gateway can retry on.
            log.warning("%s: request %s failed: %s", svc.instance_id, rid, e)
            yield worker_pb2.DecodeResponse(
                request_id=request.request_id,
                finish_reason=common_pb2.FINISH_REASON_ERROR,
                error=make_error(common_pb2.ERROR_CODE_INTERNAL, str(e), instance_id=svc.instance_id, retryable=True),
            )
        finally:
            svc.ids.close(request.request_id, rid)

    async def _checked_params(
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> SamplingParams:
        """The request's sampling parameters, or the call aborted (still warming up, no id, invalid parameters)."""
        svc = self.svc
        aengine = svc.aengine
        if aengine is None:
            await abort(
                context,
                common_pb2.ERROR_CODE_UNAVAILABLE,
                f"{svc.instance_id} is still warming up; retry",
                instance_id=svc.instance_id,
            )
        assert aengine is not None
        if not request.request_id:
            await abort(
                context,
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                "request_id is empty; set a unique id",
                instance_id=svc.instance_id,
            )
        try:
            return sampling_from_pb(request.sampling).validate(vocab_size=aengine.engine.runner.vocab_size)
        except InvalidRequest as e:
            await abort(context, common_pb2.ERROR_CODE_INVALID_ARGUMENT, str(e), instance_id=svc.instance_id)
            raise  # not reached: abort raises

    async def _stream(
        self, request: worker_pb2.DecodeRequest, rid: str, params: SamplingParams, head: worker_pb2.DecodeResponse
    ) -> AsyncIterator[RequestOutput]:
        """The request's deltas: through a prefill instance (the decode role's hand-off) or prefilled here (after
        loading what the kvstore has of the prompt)."""
        svc = self.svc
        aengine = svc.aengine
        assert aengine is not None
        if self.remote is not None and self.remote.wants(request):
            return self.remote.run(request, rid, params, head)
        media = await local_media(svc, request.media) if request.media else ()
        kv = svc.kvstore
        if kv is not None and not media:  # the store's keys are text-only page hashes: no images
            await kv.load(rid, list(request.prompt_token_ids), trace=request.trace)
        return aengine.generate(rid, list(request.prompt_token_ids), params, priority=request.priority, media=media)

    def _store_conversation(self, request: worker_pb2.DecodeRequest, out: RequestOutput, output_ids: list[int]) -> None:
        """A finished sample: the whole conversation so far goes to the kvstore, so its next turn finds its
        history (text-only prompts: the store's keys do not see images)."""
        kv = self.svc.kvstore
        if kv is not None and not request.media and kv.wants_store(finished=True, reused=out.num_cached_tokens > 0):
            kv.store_later([*request.prompt_token_ids, *output_ids], trace=request.trace)


def _message(request_id: str, out: RequestOutput, num_output_tokens: int) -> worker_pb2.DecodeResponse:
    """One delta as a stream message; a finished sample's carries its matched stop and usage."""
    msg = worker_pb2.DecodeResponse(
        request_id=request_id, token_ids=list(out.new_token_ids), finish_reason=finish_to_pb(out), index=out.index
    )
    if out.new_logprobs:
        msg.logprobs.extend(logprob_to_pb(lp) for lp in out.new_logprobs)
    if out.prompt_logprobs:
        msg.prompt_logprobs.extend(logprob_to_pb(lp) for lp in out.prompt_logprobs)
    if out.finished:
        stop = matched_stop_to_pb(out.stop_reason)
        if stop is not None:
            msg.matched_stop.CopyFrom(stop)
        msg.usage.CopyFrom(
            common_pb2.Usage(
                prompt_tokens=out.num_prompt_tokens,
                completion_tokens=num_output_tokens,
                cached_tokens=out.num_cached_tokens,
            )
        )
    return msg


async def local_media(svc: EngineService, media: Sequence[common_pb2.MediaInput]) -> list[MediaInput]:
    """The request's images embedded by this process's own tower (InvalidRequest for a text-only model)."""
    if svc.vision is None:
        raise InvalidRequest(f"{svc.instance_id} serves a text-only model; it cannot take images", field="media")
    return await svc.vision.embed(media)
