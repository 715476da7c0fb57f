"""The gateway's client of the encoders: Embed on the least-loaded encoder, retried elsewhere when one fails.

    refusal   overloaded / draining: another encoder is tried; refusals use no retry budget, and end when every
              candidate refused (-> 429 / 503 with Retry-After)
    failure   unreachable, crashed mid-request, INTERNAL, or no answer within `timeout_s` (a hung encoder): that
              encoder is excluded and the request goes to another one, up to `retries` times (-> 503 / 504 after)
    refused   INVALID_ARGUMENT / NOT_FOUND from the encoder are the request's fault: 400 / 404 at once, no retry

Embedding is a pure function of its input, so a retry can never duplicate an effect.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
import numpy as np

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.gateway.backend import (
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
)
from services.gateway.routing.channels import ChannelPool
from services.gateway.routing.discovery import MembershipView
from services.gateway.routing.encoders import ENCODER_ROLE, EncoderRouter
from shared.cluster.bus.load import LoadTable
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.instance import Modality
from shared.cluster.membership import EventKind, MembershipEvent

log = logging.getLogger(__name__)

_REFUSALS = (common_pb2.ERROR_CODE_OVERLOADED, common_pb2.ERROR_CODE_DRAINING)


@dataclass(frozen=True)
class EmbedCall:
    """One embedding request as the gateway validated it."""

    request_id: str
    model: str
    texts: tuple[str, ...] = ()
    token_inputs: tuple[tuple[int, ...], ...] = ()
    dimensions: int = 0
    truncate_prompt_tokens: int = 0  # 0: refuse over-long inputs; N: keep the first N tokens
    trace_headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray  # [inputs, dim] float32
    prompt_tokens: int
    instance_id: str
    attempts: int


class EncoderBackend:
    def __init__(
        self,
        membership: MembershipView,
        loads: LoadTable,
        *,
        timeout_s: float = 30.0,
        retries: int = 2,
        channels: ChannelPool | None = None,
    ) -> None:
        self.router = EncoderRouter(membership, loads)
        self.timeout_s = timeout_s
        self.retries = retries
        self.channels = channels if channels is not None else ChannelPool()
        self._membership = membership
        self._unsubscribe = membership.on_event(self._on_membership)
        self.failures = 0  # attempts that failed and were retried elsewhere (metrics, tests)

    def _on_membership(self, ev: MembershipEvent) -> None:
        if ev.kind == EventKind.LEAVE and ev.instance.role == ENCODER_ROLE:
            self.channels.discard(ev.instance.instance_id)

    async def close(self) -> None:
        self._unsubscribe()
        await self.channels.close()

    async def embed(self, call: EmbedCall) -> EmbedResult:
        router = self.router
        exclude: set[str] = set()
        failures = 0
        refused_overloaded = False
        last = ""
        req = worker_pb2.EmbedRequest(
            model=call.model,
            texts=list(call.texts),
            request_id=call.request_id,
            dimensions=call.dimensions,
            truncate_prompt_tokens=call.truncate_prompt_tokens,
            token_inputs=[worker_pb2.EmbedTokens(ids=list(t)) for t in call.token_inputs],
        )
        for k, v in call.trace_headers:
            if k == "traceparent":
                req.trace.traceparent = v
            elif k == "tracestate":
                req.trace.tracestate = v
        attempts = 0
        while True:
            cands = router.candidates(Modality.EMBEDDING, call.model)
            if not cands:
                if attempts == 0:
                    raise ModelNotFound(f"no ready encoder serves the embedding model {call.model!r}")
                raise BackendUnavailable(f"no encoder of {call.model!r} left to try ({last})", retry_after_s=1.0)
            pick = router.pick(cands, exclude)
            if pick is None:
                if refused_overloaded and not failures:
                    raise BackendOverloaded(f"every encoder of {call.model!r} is busy", retry_after_s=1.0)
                raise BackendUnavailable(
                    f"every encoder of {call.model!r} failed the request ({last})", retry_after_s=1.0
                )
            attempts += 1
            stub = worker_pb2_grpc.EncoderStub(self.channels.get(pick.instance_id, pick.grpc_address))
            router.begin(pick.instance_id)
            try:
                resp = await stub.Embed(req, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as e:
                err = error_from_rpc(e)
                code = err.code if err is not None else None
                if code == common_pb2.ERROR_CODE_INVALID_ARGUMENT:
                    raise InvalidRequest(
                        err.message if err else e.details() or "invalid input", param="input"
                    ) from None
                if code == common_pb2.ERROR_CODE_NOT_FOUND:
                    raise ModelNotFound(err.message if err else "model not found") from None
                exclude.add(pick.instance_id)
                last = f"{pick.instance_id}: {err.message if err else e.code().name + ' ' + (e.details() or '')}"
                if code in _REFUSALS:
                    refused_overloaded |= code == common_pb2.ERROR_CODE_OVERLOADED
                    continue
                failures += 1
                self.failures += 1
                log.warning(
                    "embed %s failed on %s (%s); %s",
                    call.request_id,
                    pick.instance_id,
                    last,
                    "retrying on another encoder" if failures <= self.retries else "giving up",
                )
                if failures > self.retries:
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise BackendTimeout(f"no encoder answered within {self.timeout_s:g} s ({last})") from None
                    raise BackendUnavailable(f"the encoders failed the request ({last})", retry_after_s=1.0) from None
                continue
            finally:
                router.end(pick.instance_id)
            t = resp.embeddings
            if (
                t.dtype != common_pb2.DTYPE_FLOAT32
                or len(t.shape) != 2
                or t.shape[0] != len(req.texts or req.token_inputs)
            ):
                raise BackendError(f"encoder {pick.instance_id} answered a malformed tensor {list(t.shape)}")
            vectors = np.frombuffer(t.data, dtype="<f4").reshape(t.shape[0], t.shape[1])
            return EmbedResult(vectors, resp.prompt_tokens, resp.instance_id or pick.instance_id, attempts)
