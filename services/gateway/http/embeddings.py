"""`POST /v1/embeddings` (OpenAI's shape) and the gRPC `Gateway.Embed`, over the cluster's encoders.

    input              a string, a list of strings, a list of token ids, or a list of such lists (at most
                       MAX_INPUTS); empty strings and empty lists are refused, as OpenAI refuses them
    encoding_format    "float" (lists of numbers) or "base64" (little-endian float32 bytes, what the openai
                       client asks for by default and decodes)
    dimensions         only sizes the model was trained for (Matryoshka models); the encoder says which
    truncate_prompt_tokens   (vLLM's extension) -1: cut inputs to the model's max sequence length; N: to N tokens.
                       Without it an input over the limit is a 400 naming the limit
    usage              prompt_tokens = total_tokens = the tokens the model read

The encoder tokenizes (its model's tokenizer) and enforces the limits; the gateway validates the shape, picks the
model among those the encoders registered, and lets `EncoderBackend` route and retry.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import grpc
import msgspec

if TYPE_CHECKING:
    from shared.cluster.tls import TlsFiles
    from shared.config.groups import HttpConfig

from proto.pdrelay.v1 import common_pb2, gateway_pb2
from services.gateway.backend import BackendError
from services.gateway.backends.encoder_backend import EmbedCall, EmbedResult, EncoderBackend
from services.gateway.http.asgi import Receive, Responder, Scope, read_body
from services.gateway.http.json_body import decode_body
from services.gateway.openai.errors import ApiError, bad_request, from_backend
from services.gateway.openai.responses import ModelCard
from services.gateway.routing.channels import ChannelPool
from services.gateway.routing.discovery import MembershipView
from shared.cluster.bus.load import LoadTable
from shared.cluster.grpc_errors import abort
from shared.cluster.instance import EncoderInfo

MAX_INPUTS = 2048  # OpenAI's limit of inputs per request
_TRACE_HEADERS = (b"traceparent", b"tracestate")
_CODES = {
    400: common_pb2.ERROR_CODE_INVALID_ARGUMENT,
    413: common_pb2.ERROR_CODE_INVALID_ARGUMENT,
    404: common_pb2.ERROR_CODE_NOT_FOUND,
    429: common_pb2.ERROR_CODE_OVERLOADED,
    503: common_pb2.ERROR_CODE_UNAVAILABLE,
    504: common_pb2.ERROR_CODE_TIMEOUT,
}


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    # msgspec takes one array type in a union: the element types are checked in `inputs_of`.
    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None


class EmbeddingData(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage


_DECODER = msgspec.json.Decoder(EmbeddingRequest)
_ENC = msgspec.json.Encoder()


def _is_token_list(x: object) -> bool:
    return isinstance(x, list) and all(type(t) is int for t in x)


def inputs_of(value: str | list[Any]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """(texts, token id lists) of an OpenAI `input`; exactly one is non-empty. Raises ApiError (400)."""
    if isinstance(value, str):
        if not value:
            raise bad_request("input must not be an empty string", "input")
        return (value,), ()
    if not value:
        raise bad_request("input must not be an empty list; send a string, a list of strings or token ids", "input")
    if len(value) > MAX_INPUTS:
        raise bad_request(f"input has {len(value)} items; at most {MAX_INPUTS} per request", "input")
    if all(isinstance(x, str) for x in value):
        for i, x in enumerate(value):
            if not x:
                raise bad_request(f"input[{i}] is an empty string; every input needs some text", "input")
        return tuple(value), ()
    token_lists = [value] if _is_token_list(value) else value
    if not all(_is_token_list(x) for x in token_lists):
        raise bad_request(
            "input must be a string, a list of strings, a list of token ids (integers) or a list of "
            "such lists; not a mix",
            "input",
        )
    for i, ids in enumerate(token_lists):
        if not ids:
            raise bad_request(f"input[{i}] is an empty list of token ids", "input")
        bad = next((t for t in ids if not 0 <= t < 1 << 32), None)
        if bad is not None:
            raise bad_request(f"input[{i}] has token id {bad}; token ids are integers >= 0", "input")
    return (), tuple(tuple(ids) for ids in token_lists)


class Embeddings:
    """The embeddings API of one gateway, shared by HTTP and gRPC."""

    def __init__(self, backend: EncoderBackend, *, max_request_bytes: int = 4 << 20) -> None:
        self.backend = backend
        self.max_request_bytes = max_request_bytes
        self._created = int(time.time())

    # ---- models ------------------------------------------------------------------------------------------------
    def model_cards(self) -> list[ModelCard]:
        return [
            ModelCard(id=name, created=self._created, max_model_len=info.max_seq_len or None)
            for name, info in sorted(self.backend.router.embedding_models().items())
        ]

    def _model(self, requested: str | None) -> tuple[str, EncoderInfo]:
        models = self.backend.router.embedding_models()
        if requested:
            info = models.get(requested)
            if info is None:
                served = ", ".join(sorted(models)) or "none (no encoder is ready)"
                raise ApiError(
                    404,
                    f"model {requested!r} is not an embedding model served here; embedding models: {served}",
                    param="model",
                    code="model_not_found",
                )
            return requested, info
        if len(models) == 1:
            return next(iter(models.items()))
        if not models:
            raise ApiError(
                503, "no encoder is ready to compute embeddings; retry later", code="unavailable", retry_after_s=1
            )
        raise bad_request(
            f"model is required: this gateway serves several embedding models ({', '.join(sorted(models))})", "model"
        )

    # ---- one request -------------------------------------------------------------------------------------------
    def plan(self, req: EmbeddingRequest, request_id: str, trace: tuple[tuple[str, str], ...] = ()) -> EmbedCall:
        texts, token_inputs = inputs_of(req.input)
        if req.dimensions is not None and req.dimensions < 1:
            raise bad_request(f"dimensions must be >= 1 (got {req.dimensions})", "dimensions")
        model, info = self._model(req.model)
        return EmbedCall(
            request_id=request_id,
            model=model,
            texts=texts,
            token_inputs=token_inputs,
            dimensions=req.dimensions or 0,
            truncate_prompt_tokens=self._truncation(req.truncate_prompt_tokens, info),
            trace_headers=trace,
        )

    @staticmethod
    def _truncation(value: int | None, info: EncoderInfo) -> int:
        if value is None or value == 0:
            return 0
        if value == -1:
            return info.max_seq_len
        limit = info.max_seq_len
        if value < -1 or (limit and value > limit):
            raise bad_request(
                f"truncate_prompt_tokens {value} must be -1 (the model's max of {limit} tokens) or 1..{limit}",
                "truncate_prompt_tokens",
            )
        return value

    async def run(self, call: EmbedCall) -> EmbedResult:
        try:
            return await self.backend.embed(call)
        except BackendError as e:
            raise from_backend(e) from None

    # ---- HTTP --------------------------------------------------------------------------------------------------
    async def http(self, scope: Scope, receive: Receive, r: Responder) -> None:
        body = await read_body(scope, receive, self.max_request_bytes)
        try:
            req = decode_body(_DECODER, body)  # `2.0` is a JSON integer; too deep nesting is a 400
        except msgspec.ValidationError as e:
            raise bad_request(f"invalid request: {e}") from None
        except msgspec.DecodeError as e:
            raise bad_request(f"request body is not valid JSON ({e})", code="invalid_json") from None
        trace = tuple((k.decode(), v.decode("latin-1")) for k, v in scope["headers"] if k in _TRACE_HEADERS)
        call = self.plan(req, "embd-" + uuid.uuid4().hex, trace)
        res = await self.run(call)
        if req.encoding_format == "base64":
            data = [
                EmbeddingData(index=i, embedding=base64.b64encode(row.tobytes()).decode("ascii"))
                for i, row in enumerate(res.vectors)
            ]
        else:
            data = [EmbeddingData(index=i, embedding=row) for i, row in enumerate(res.vectors.tolist())]
        resp = EmbeddingResponse(
            id=call.request_id,
            created=int(time.time()),
            model=call.model,
            data=data,
            usage=EmbeddingUsage(prompt_tokens=res.prompt_tokens, total_tokens=res.prompt_tokens),
        )
        await r.full(200, _ENC.encode(resp))

    # ---- gRPC --------------------------------------------------------------------------------------------------
    async def grpc(
        self, request: gateway_pb2.EmbeddingsRequest, context: grpc.aio.ServicerContext, instance_id: str = ""
    ) -> gateway_pb2.EmbeddingsResponse:
        trace: tuple[tuple[str, str], ...] = ()
        if request.trace.traceparent:
            trace = (("traceparent", request.trace.traceparent),) + (
                (("tracestate", request.trace.tracestate),) if request.trace.tracestate else ()
            )
        value: str | list[Any]
        if request.texts and request.token_ids:
            value = [*request.texts, *(list(t.ids) for t in request.token_ids)]  # refused as a mix
        elif request.token_ids:
            value = [list(t.ids) for t in request.token_ids]
        else:
            value = list(request.texts)
        req = EmbeddingRequest(
            input=value,
            model=request.model or None,
            dimensions=request.dimensions or None,
            truncate_prompt_tokens=request.truncate_prompt_tokens or None,
        )
        try:
            call = self.plan(req, request.request_id or "embd-" + uuid.uuid4().hex, trace)
            res = await self.run(call)
        except ApiError as e:
            await abort(
                context, _CODES.get(e.status, common_pb2.ERROR_CODE_INTERNAL), e.message, instance_id=instance_id
            )
        return gateway_pb2.EmbeddingsResponse(
            request_id=call.request_id,
            model=call.model,
            data=[gateway_pb2.Embedding(values=row) for row in res.vectors.tolist()],
            usage=common_pb2.Usage(prompt_tokens=res.prompt_tokens),
        )


class RouteTable(Protocol):
    """Where an API mounts (GatewayApp): a protocol, so that app.py, which imports this module, is not imported back."""

    def add_route(
        self,
        path: str,
        method: str,
        handler: Callable[[Scope, Receive, Responder], Awaitable[None]],
        *,
        needs_api_key: bool = True,
        models: Callable[[], list[ModelCard]] | None = None,
    ) -> None: ...


def mount_embeddings(
    app: RouteTable, membership: MembershipView, loads: LoadTable, http_cfg: HttpConfig, tls: TlsFiles | None = None
) -> Embeddings:
    """/v1/embeddings on `app` (a GatewayApp) over the encoders in `membership`, loads from `loads` (the
    gateway's NATS load table); timeouts and retries from the http config group."""
    backend = EncoderBackend(
        membership,
        loads,
        timeout_s=http_cfg.encoder_timeout_s,
        channels=ChannelPool(tls=tls),
        retries=http_cfg.request_retries,
    )
    api = Embeddings(backend, max_request_bytes=http_cfg.max_request_bytes)
    app.add_route("/v1/embeddings", "POST", api.http, models=api.model_cards)
    return api
