"""The Encoder gRPC servicer: Embed (sentence embeddings, dynamically batched) and Encode (the vision tower).

Embed: check the request (model name, inputs, dimensions, max sequence length), tokenize, wait for the batcher's
forward, answer one float32 tensor [inputs, dim]. Encode: hand the request to the service's VisionEncoder, or
UNIMPLEMENTED when this instance runs no vision tower. Errors are typed (shared.cluster.grpc_errors).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

import grpc
import numpy as np

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.encoder.embedding import finish
from services.encoder.errors import EncoderError
from shared.cluster.grpc_errors import abort, error_metadata, make_error
from shared.config.choices import Fault
from shared.telemetry import spans

if TYPE_CHECKING:
    from services.encoder.batcher import EmbedBatcher
    from services.encoder.embedding import SentenceEmbedder
    from services.encoder.metrics import EncoderMetrics
    from services.encoder.vision import VisionEncoder
    from shared.service.faults import Faults
    from shared.telemetry.service import ServiceTelemetry

EMBED_SPAN = "encoder.embed"
# How long `encoder_hang` stalls: longer than any caller's deadline, so the caller's timeout is what ends it.
HANG_S = 3600.0


class EncoderHost(Protocol):
    """What the servicer reads of its service (services/encoder/service.py), declared here so that the servicer
    does not import the service that constructs it."""

    instance_id: str
    telemetry: ServiceTelemetry
    metrics: EncoderMetrics
    faults: Faults
    embedder: SentenceEmbedder | None
    batcher: EmbedBatcher | None
    vision: VisionEncoder | None


class EncoderServicer(worker_pb2_grpc.EncoderServicer):
    def __init__(self, svc: EncoderHost) -> None:
        self.svc = svc

    async def Embed(
        self, request: worker_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.EmbedResponse:
        svc = self.svc
        t0 = time.monotonic()
        n = len(request.texts) or len(request.token_inputs)
        with svc.telemetry.server_rpc(
            EMBED_SPAN,
            request.trace,
            context,
            request.request_id,
            {spans.MODEL: request.model, "pdrelay.embed.inputs": n},
        ) as rpc:
            try:
                resp = await self._embed(request)
            except EncoderError as e:
                await abort(context, e.code, e.message, instance_id=svc.instance_id)
            if rpc.span is not None and rpc.span.is_recording():
                rpc.span.set_attribute(spans.PROMPT_TOKENS, resp.prompt_tokens)
            svc.metrics.embed_latency.observe(time.monotonic() - t0)
            return resp

    async def _embed(self, request: worker_pb2.EmbedRequest) -> worker_pb2.EmbedResponse:
        svc = self.svc
        me = svc.instance_id
        embedder, batcher = svc.embedder, svc.batcher
        if embedder is None or batcher is None:
            code = common_pb2.ERROR_CODE_UNAVAILABLE if svc.vision is None else common_pb2.ERROR_CODE_NOT_FOUND
            raise EncoderError(
                code,
                f"{me} serves no embedding model" if svc.vision is not None else f"{me} is still warming up; retry",
            )
        spec = embedder.spec
        if request.model and request.model != spec.name:
            raise EncoderError(
                common_pb2.ERROR_CODE_NOT_FOUND,
                f"model {request.model!r} is not served by {me}; it serves {spec.name!r}",
            )
        if request.texts and request.token_inputs:
            raise EncoderError(common_pb2.ERROR_CODE_INVALID_ARGUMENT, "send texts or token_inputs, not both")
        if not request.texts and not request.token_inputs:
            raise EncoderError(common_pb2.ERROR_CODE_INVALID_ARGUMENT, "no input: send texts or token_inputs")
        dims = embedder.check_dimensions(request.dimensions)
        cut = embedder.truncation_limit(request.truncate_prompt_tokens)
        if request.texts:
            # Tokenizing is quick (Rust) next to a forward; off the loop anyway for large requests.
            texts = list(request.texts)
            ids = (
                embedder.tokenize(texts, cut)
                if len(texts) <= 8
                else await asyncio.to_thread(embedder.tokenize, texts, cut)
            )
        else:
            ids = embedder.check_token_inputs([list(t.ids) for t in request.token_inputs], cut)
        svc.faults.crash_if(Fault.ENCODER_CRASH)
        await svc.faults.hang_if(Fault.ENCODER_HANG, HANG_S)
        num_tokens = sum(len(x) for x in ids)
        vectors = await batcher.submit(ids)
        vectors = finish(vectors, dims, request.normalize, spec.normalized)
        svc.metrics.tokens.inc(num_tokens)
        arr = np.ascontiguousarray(vectors.numpy(), dtype="<f4")
        return worker_pb2.EmbedResponse(
            embeddings=worker_pb2.Tensor(dtype=common_pb2.DTYPE_FLOAT32, shape=list(arr.shape), data=arr.tobytes()),
            prompt_tokens=num_tokens,
            instance_id=me,
        )

    async def Encode(
        self, request: worker_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.EncodeResponse:
        svc = self.svc
        vision = svc.vision
        if vision is None:
            msg = (
                f"{svc.instance_id} runs no vision tower: start the encoder with a vision-language --model to "
                "encode images"
            )
            err = make_error(common_pb2.ERROR_CODE_INVALID_ARGUMENT, msg, instance_id=svc.instance_id, retryable=False)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, msg, trailing_metadata=error_metadata(err))
        assert vision is not None
        t0 = time.monotonic()
        with svc.telemetry.server_rpc(
            spans.ENCODER_ENCODE,
            request.trace,
            context,
            request.request_id,
            {"pdrelay.encoder.items": len(request.media)},
        ) as rpc:
            try:
                svc.faults.crash_if(Fault.ENCODER_CRASH)
                await svc.faults.hang_if(Fault.ENCODER_HANG, HANG_S)
                resp = await vision.encode(request)
            except EncoderError as e:
                await abort(context, e.code, e.message, instance_id=svc.instance_id)
            svc.metrics.encode_latency.observe(time.monotonic() - t0)
            hits = sum(1 for m in resp.embeddings if m.cache_hit)
            svc.metrics.observe_cache(len(resp.embeddings), hits)
            if rpc.span is not None and rpc.span.is_recording():
                rpc.span.set_attribute("pdrelay.encoder.cache_hits", hits)
            return resp
