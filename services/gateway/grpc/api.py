"""The gateway's public gRPC API (proto pdrelay.v1.Gateway): Generate, Tokenize, ListModels, Health.

The same front door as the OpenAI HTTP API, over the same tokenizer, backend, detokenizer and metrics: a
GenerateRequest is turned into the equivalent OpenAI request body and validated by the HTTP layer's own checks
(services.gateway.openai.planning), so both APIs accept and refuse exactly the same things with the same messages.
Errors before the first message end the RPC with a status code plus a typed pdrelay `Error` in the trailing
metadata (shared.cluster.grpc_errors); an error after it ends the stream with FINISH_REASON_ERROR and the Error.

Note: proto3 cannot tell an unset `skip_special_tokens` from false, so gRPC clients get special tokens (such as
the end-of-turn marker) in the text unless they set it; the HTTP API defaults to skipping them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc
import msgspec
from google.protobuf import struct_pb2

from proto.pdrelay.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from services.gateway.backend import (
    BackendChunk,
    BackendError,
    BackendRequest,
    GenerateBackend,
    TokenLogprob,
)
from services.gateway.http.embeddings import Embeddings
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai.errors import REQUEST_FAILED_CODE, ApiError, bad_request, from_backend
from services.gateway.openai.planning import Plan, plan_chat, plan_completion, template_kwargs
from services.gateway.openai.prompt import fit_context, prompt_ids
from services.gateway.openai.requests import ChatCompletionRequest, CompletionRequest
from services.gateway.routing.discovery import MembershipView
from services.gateway.text.generation import Delta, Generation
from services.gateway.text.tokenizer import ChatTemplateError, GatewayTokenizer
from shared.cluster.grpc_errors import abort, make_error

_FINISH = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
# HTTP status of an ApiError -> pdrelay ErrorCode (its gRPC status follows from the code).
_CODES = {
    400: common_pb2.ERROR_CODE_INVALID_ARGUMENT,
    413: common_pb2.ERROR_CODE_INVALID_ARGUMENT,
    404: common_pb2.ERROR_CODE_NOT_FOUND,
    429: common_pb2.ERROR_CODE_OVERLOADED,
    503: common_pb2.ERROR_CODE_UNAVAILABLE,
    504: common_pb2.ERROR_CODE_TIMEOUT,
}
_ROLES = ("decode", "prefill", "worker", "encoder", "kvstore", "gateway")


@dataclass(frozen=True)
class ApiContext:
    """Everything the API serves from; the gateway service builds it once its tokenizer and backend are up."""

    backend: GenerateBackend
    tokenizer: GatewayTokenizer
    served_model_names: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    model_root: str | None = None
    metrics: GatewayMetrics = dataclasses.field(default_factory=GatewayMetrics)
    membership: MembershipView | None = None
    instance_id: str = ""
    embeddings: Embeddings | None = None  # the embeddings API (services.gateway.http.embeddings), when mounted
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))


def error_code(err: ApiError) -> int:
    if err.code == REQUEST_FAILED_CODE:
        return common_pb2.ERROR_CODE_REQUEST_FAILED
    return _CODES.get(err.status, common_pb2.ERROR_CODE_INTERNAL)


def _sampling_fields(sp: common_pb2.SamplingParams) -> dict[str, Any]:
    """The OpenAI body fields of a proto SamplingParams (unset optionals are left out: the defaults apply)."""
    body: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "repetition_penalty"):
        if sp.HasField(name):
            body[name] = getattr(sp, name)
    if sp.stop:
        body["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        body["stop_token_ids"] = list(sp.stop_token_ids)
    body.update(
        ignore_eos=sp.ignore_eos,
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        skip_special_tokens=sp.skip_special_tokens,
    )
    if sp.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in sp.logit_bias.items()}
    if sp.HasField("structured"):
        body["structured_outputs"] = _STRUCTURED_FIELD.get(sp.structured.kind, lambda s: {})(sp.structured.spec)
    if sp.n:
        body["n"] = sp.n
    if sp.HasField("prompt_logprobs"):
        body["prompt_logprobs"] = sp.prompt_logprobs
    return body


def _choice(spec: str) -> dict[str, Any]:
    """A CHOICE spec (a JSON array of strings) as structured_outputs.choice; text that is not JSON is a 400."""
    try:
        return {"choice": json.loads(spec) if spec else []}
    except (ValueError, RecursionError):  # RecursionError: nested too deep for the decoder
        raise bad_request(
            f"sampling.structured.spec: a GRAMMAR_KIND_CHOICE spec is a JSON array of strings, such as "
            f'["yes", "no"] (got {spec[:60]!r})',
            "sampling.structured.spec",
        ) from None


_STRUCTURED_FIELD = {  # proto GrammarKind -> the structured_outputs extension object the HTTP API validates
    common_pb2.GRAMMAR_KIND_JSON_OBJECT: lambda spec: {"json_object": True},
    common_pb2.GRAMMAR_KIND_JSON_SCHEMA: lambda spec: {"json": spec},
    common_pb2.GRAMMAR_KIND_REGEX: lambda spec: {"regex": spec},
    common_pb2.GRAMMAR_KIND_CHOICE: _choice,
    common_pb2.GRAMMAR_KIND_GRAMMAR: lambda spec: {"grammar": spec},
}


def _plain(value: struct_pb2.Value) -> Any:
    """A google.protobuf.Value as the JSON value it stands for; a whole number as an int (JSON's 1, not 1.0)."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        n = value.number_value
        return int(n) if math.isfinite(n) and n.is_integer() else n
    if kind == "struct_value":
        return {k: _plain(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind in ("string_value", "bool_value"):
        return getattr(value, kind)
    return None  # null_value, or no kind set


def chat_template_kwargs_of(chat: gateway_pb2.ChatMessages) -> dict[str, Any] | None:
    """ChatMessages.chat_template_kwargs as the HTTP API's chat_template_kwargs (None when unset)."""
    if not chat.HasField("chat_template_kwargs"):
        return None
    return {k: _plain(v) for k, v in chat.chat_template_kwargs.fields.items()}


def plan_of(request: gateway_pb2.GenerateRequest, vocab_size: int) -> Plan:
    """Validate a GenerateRequest exactly as the HTTP API validates the equivalent OpenAI body (raises ApiError)."""
    if request.media:
        raise bad_request(
            "media: images are accepted over HTTP only (/v1/chat/completions image_url parts); send text here", "media"
        )
    body = _sampling_fields(request.sampling)
    # Every RPC streams; HTTP's stream flag only shapes SSE answers, which have no place for prompt_logprobs (so
    # HTTP refuses the pair) while GenerateResponse has.
    body["stream"] = False
    body["priority"] = request.priority
    if request.model:
        body["model"] = request.model
    which = request.WhichOneof("input")
    sp = request.sampling
    try:
        if which == "chat":
            if request.echo:
                raise bad_request("echo: only with text or token_ids input", "echo")
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.chat.messages]
            body["chat_template_kwargs"] = chat_template_kwargs_of(request.chat)
            body["logprobs"] = sp.logprobs
            if sp.logprobs:
                body["top_logprobs"] = sp.top_logprobs
            return plan_chat(msgspec.convert(body, ChatCompletionRequest), vocab_size=vocab_size)
        if which == "text":
            body["prompt"] = request.text
        elif which == "token_ids":
            body["prompt"] = list(request.token_ids.ids)
        else:
            raise bad_request("input: set one of text, token_ids or chat", "input")
        if sp.logprobs:
            body["logprobs"] = sp.top_logprobs
        body["echo"] = request.echo
        return plan_completion(msgspec.convert(body, CompletionRequest), vocab_size=vocab_size)
    except msgspec.ValidationError as e:
        raise bad_request(f"invalid request: {e}") from None


def logprobs_to_pb(entries: Sequence[TokenLogprob]) -> list[common_pb2.TokenLogprob]:
    return [
        common_pb2.TokenLogprob(
            token_id=e.token_id,
            logprob=e.logprob,
            rank=e.rank,
            top_logprobs=[common_pb2.TopLogprob(token_id=t.token_id, logprob=t.logprob) for t in e.top_logprobs],
        )
        for e in entries
    ]


class _TokenTap:
    """Passes a backend's chunks through to Generation while recording their token ids per sample (Delta carries
    text only)."""

    def __init__(self, backend: GenerateBackend) -> None:
        self._backend = backend
        self.pending: dict[int, list[int]] = {}

    def take(self, index: int) -> list[int]:
        return self.pending.pop(index, [])

    def generate(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        return self._tap(req)

    async def _tap(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        inner = self._backend.generate(req)
        try:
            async for chunk in inner:
                self.pending.setdefault(chunk.index, []).extend(chunk.token_ids)
                yield chunk
        finally:
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                await aclose()  # `async for` does not close the inner stream when we are closed


class GatewayApi(gateway_pb2_grpc.GatewayServicer):
    """Serves UNAVAILABLE until `attach()` gives it the tokenizer and backend (the gateway is warming up)."""

    def __init__(self, ctx: ApiContext | None = None) -> None:
        self.ctx = ctx

    def attach(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def _ctx(self, context: grpc.aio.ServicerContext) -> ApiContext:
        if self.ctx is None:
            await abort(context, common_pb2.ERROR_CODE_UNAVAILABLE, "the gateway is still starting; retry shortly")
        assert self.ctx is not None
        return self.ctx

    def _model(self, ctx: ApiContext, requested: str) -> str:
        if not requested:
            return ctx.served_model_names[0]
        if requested in ctx.served_model_names:
            return requested
        if requested in ctx.aliases:
            return ctx.served_model_names[0]
        raise ApiError(
            404,
            f"model {requested!r} is not served here; ListModels lists: {', '.join(ctx.served_model_names)}",
            param="model",
            code="model_not_found",
        )

    async def _fail(self, context: grpc.aio.ServicerContext, ctx: ApiContext, err: ApiError) -> None:
        await abort(context, error_code(err), err.message, instance_id=ctx.instance_id)

    # ------------------------------------------------------------------ Generate

    def _prepare(self, ctx: ApiContext, request: gateway_pb2.GenerateRequest) -> tuple[Plan, BackendRequest]:
        tok = ctx.tokenizer
        plan = plan_of(request, tok.vocab_size)
        model = self._model(ctx, request.model)
        ids = prompt_ids(plan, tok, template_param="chat", prompt_param="input")
        sampling = fit_context(plan.sampling, len(ids), tok.context_length, prompt_param="input")
        trace: tuple[tuple[str, str], ...] = ()
        if request.trace.traceparent:
            trace = (("traceparent", request.trace.traceparent),) + (
                (("tracestate", request.trace.tracestate),) if request.trace.tracestate else ()
            )
        rid = request.request_id or f"gen-{uuid.uuid4().hex}"
        return plan, BackendRequest(
            request_id=rid,
            model=model,
            prompt_token_ids=ids,
            sampling=sampling,
            trace_headers=trace,
            priority=plan.priority,
        )

    async def Generate(
        self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.GenerateResponse]:
        ctx = await self._ctx(context)
        arrival = time.perf_counter()
        try:
            plan, breq = self._prepare(ctx, request)
        except ApiError as e:
            await self._fail(context, ctx, e)
        tap = _TokenTap(ctx.backend)
        gen = Generation(
            cast("GenerateBackend", tap),
            ctx.tokenizer,
            breq,  # Generation calls only generate()
            skip_special_tokens=plan.skip_special_tokens,
            metrics=ctx.metrics,
            arrival=arrival,
        )
        ctx.metrics.started(gen.num_prompt_tokens)
        first = True
        echo = ctx.tokenizer.decode(breq.prompt_token_ids, skip_special_tokens=False) if plan.echo else ""
        echoed: set[int] = set()  # samples whose stream began with the prompt
        try:
            while True:
                try:
                    delta = await gen.next()
                except BackendError as e:
                    err = from_backend(e)
                    if first:
                        await self._fail(context, ctx, err)
                    yield gateway_pb2.GenerateResponse(
                        request_id=breq.request_id,
                        finish_reason=common_pb2.FINISH_REASON_ERROR,
                        error=make_error(error_code(err), err.message, instance_id=ctx.instance_id),
                    )
                    return
                first = False
                if echo and delta.index not in echoed:  # the prompt's text leads each sample (the HTTP API's echo)
                    echoed.add(delta.index)
                    delta.text = echo + delta.text
                yield self._response(breq, request.return_token_ids, gen, delta, tap.take(delta.index))
                if gen.finished:  # n > 1: every sample has ended
                    return
        finally:
            ctx.metrics.ended(gen.num_prompt_tokens, gen.num_generated)
            await gen.aclose()  # stop string, error or cancelled RPC: abort the request on the worker

    @staticmethod
    def _response(
        breq: BackendRequest, with_ids: bool, gen: Generation, delta: Delta, token_ids: list[int]
    ) -> gateway_pb2.GenerateResponse:
        msg = gateway_pb2.GenerateResponse(request_id=breq.request_id, text=delta.text, index=delta.index)
        if with_ids:
            msg.token_ids.extend(token_ids)
        if delta.logprobs:
            msg.logprobs.extend(logprobs_to_pb(delta.logprobs))
        if delta.prompt is not None:  # prompt_logprobs (or echo with logprobs): the first message only
            msg.prompt_token_ids.extend(t for t, _ in delta.prompt)
            msg.prompt_logprobs.extend(logprobs_to_pb([p for _, p in delta.prompt if p is not None]))
        if delta.finish_reason is not None:
            msg.finish_reason = _FINISH.get(delta.finish_reason, common_pb2.FINISH_REASON_STOP)
            if isinstance(delta.stop_reason, str):
                msg.matched_stop.text = delta.stop_reason
            elif isinstance(delta.stop_reason, int):
                msg.matched_stop.token_id = delta.stop_reason
        if gen.finished:
            msg.usage.CopyFrom(
                common_pb2.Usage(
                    prompt_tokens=gen.num_prompt_tokens,
                    completion_tokens=gen.num_generated,
                    cached_tokens=gen.num_cached_tokens,
                )
            )
        return msg

    # ------------------------------------------------------------------ small RPCs

    async def Tokenize(
        self, request: gateway_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.TokenizeResponse:
        ctx = await self._ctx(context)
        tok = ctx.tokenizer
        try:
            self._model(ctx, request.model)
            which = request.WhichOneof("input")
            if which == "chat":
                messages = [{"role": m.role, "content": m.content} for m in request.chat.messages]
                if not messages:
                    raise bad_request("chat: send at least one message", "chat")
                kwargs = template_kwargs(chat_template_kwargs_of(request.chat))
                try:
                    ids = tok.encode_chat(messages, kwargs)
                except ChatTemplateError as e:
                    raise bad_request(str(e), "chat", "chat_template_error") from None
            elif which == "text":
                ids = tok.encode_text(request.text, add_special_tokens=request.add_special_tokens)
            else:
                raise bad_request("input: set text or chat", "input")
        except ApiError as e:
            await self._fail(context, ctx, e)
        return gateway_pb2.TokenizeResponse(token_ids=ids, max_model_len=tok.context_length or 0)

    async def ListModels(
        self, request: gateway_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListModelsResponse:
        ctx = await self._ctx(context)
        return gateway_pb2.ListModelsResponse(
            models=[
                gateway_pb2.ModelCard(
                    id=name,
                    owned_by="pdrelay",
                    created=ctx.created,
                    max_model_len=ctx.tokenizer.context_length or 0,
                    root=ctx.model_root or "",
                )
                for name in ctx.served_model_names
            ]
        )

    async def Embed(
        self, request: gateway_pb2.EmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.EmbeddingsResponse:
        ctx = await self._ctx(context)
        if ctx.embeddings is None:
            await abort(
                context,
                common_pb2.ERROR_CODE_NOT_FOUND,
                "this gateway serves no embedding models",
                instance_id=ctx.instance_id,
            )
        assert ctx.embeddings is not None
        return await ctx.embeddings.grpc(request, context, ctx.instance_id)

    async def Health(
        self, request: gateway_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.HealthResponse:
        ctx = await self._ctx(context)
        resp = gateway_pb2.HealthResponse(serving=await ctx.backend.ready())
        m = ctx.membership
        if m is not None:
            resp.discovery_stale = m.stale
            for role in _ROLES:
                total = m.instances(role)
                if total:
                    resp.roles.append(gateway_pb2.RoleHealth(role=role, total=len(total), ready=len(m.ready(role))))
        return resp
