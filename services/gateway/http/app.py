"""The gateway's HTTP front door: an ASGI app speaking the OpenAI API over a `GenerateBackend`.

Per generation request: read the body (size-limited) -> decode + type-check (msgspec) -> value checks ->
chat template + tokenize -> context-length check -> backend stream -> incremental detokenization with stop
strings -> JSON or SSE. The first backend chunk is awaited before any header is sent, so admission failures
(overload, unavailable) get their real status code and Retry-After instead of a 200 with an error event.
Every failure is an OpenAI-style error body; client input never causes a 5xx.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import msgspec
from opentelemetry.context import Context

from services.gateway.backend import BackendError, BackendRequest, GenerateBackend
from services.gateway.http.asgi import (
    ClientDisconnected,
    Receive,
    Responder,
    Scope,
    Send,
    cancel_on_disconnect,
    check_json_content_type,
    header,
    read_body,
)
from services.gateway.http.batch import BatchGeneration
from services.gateway.http.formatters import DONE, sse
from services.gateway.http.json_body import decode_body
from services.gateway.http.media.attach import MediaInputs
from services.gateway.http.media.processor import MediaProcessor
from services.gateway.http.openapi import build_openapi
from services.gateway.http.respond import formatter_for, respond
from services.gateway.http.tokenize_api import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from services.gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai.errors import ApiError, bad_request, from_backend, internal_error
from services.gateway.openai.output_parsers import OutputParsers
from services.gateway.openai.planning import ApiKind, Plan, plan_chat, plan_completion
from services.gateway.openai.prompt import fit_context, prompt_ids
from services.gateway.openai.requests import ChatCompletionRequest, CompletionRequest
from services.gateway.openai.responses import HealthStatus, ModelCard, ModelList
from services.gateway.text.generation import Generation
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.config.groups import HttpConfig
from shared.telemetry import spans
from shared.telemetry.logs import bind_request_id
from shared.telemetry.tracing import Span, SpanKind, Tracing, add_event, current_span, extract, perf_to_mono, set_error

log = logging.getLogger("pdrelay.gateway")

_ENC = msgspec.json.Encoder()
_PARAM_AT = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")
_TRACE_HEADERS = (b"traceparent", b"tracestate")

T = TypeVar("T")
Handler = Callable[[Scope, Receive, Responder], Awaitable[None]]


def _decode_error(e: msgspec.DecodeError) -> ApiError:
    """msgspec says what and where ("Expected `int`, got `str` - at `$.max_tokens`"); keep both."""
    msg = str(e)
    if isinstance(e, msgspec.ValidationError):
        at = _PARAM_AT.search(msg)
        path = at.group(1) if at else ""
        missing = _MISSING.search(msg)
        if missing:
            path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return bad_request(f"invalid request: {msg}", path or None)
    if "UTF-8" in msg:
        return bad_request(f"request body is not valid UTF-8 ({msg}); send UTF-8 encoded JSON", code="invalid_utf8")
    return bad_request(f"request body is not valid JSON ({msg})", code="invalid_json")


def _annotate(span: Span, gen: Generation | BatchGeneration, arrival: float) -> None:
    """What the gateway.request span says about the request once it is over."""
    span.set_attributes(
        {
            spans.PROMPT_TOKENS: gen.num_prompt_tokens,
            spans.OUTPUT_TOKENS: gen.num_generated,
            spans.CACHED_TOKENS: gen.num_cached_tokens,
        }
    )
    if gen.first_token_at is not None:
        span.set_attribute(spans.TTFT_MS, (gen.first_token_at - arrival) * 1e3)
        add_event(span, spans.EVENT_FIRST_TOKEN, at=perf_to_mono(gen.first_token_at))


class GatewayApp:
    """ASGI application. One instance per served model (one tokenizer)."""

    def __init__(
        self,
        *,
        backend: GenerateBackend,
        tokenizer: GatewayTokenizer,
        served_model_names: Sequence[str],
        model_aliases: Sequence[str] = (),
        api_key: str | None = None,
        max_request_bytes: int = 4 << 20,
        model_root: str | None = None,
        media: MediaProcessor | None = None,
        media_cfg: HttpConfig | None = None,
        parsers: OutputParsers | None = None,
    ) -> None:
        if not served_model_names:
            raise ValueError("served_model_names is empty; pass at least one name clients may use")
        self.backend = backend
        self.tokenizer = tokenizer
        self.served_model_names = tuple(served_model_names)
        # Every accepted spelling -> the served name echoed in answers (aliases: e.g. the --model value as typed).
        self._model_names = {a: self.served_model_names[0] for a in model_aliases}
        self._model_names.update({n: n for n in self.served_model_names})
        self.model_root = model_root
        self.media = MediaInputs(media, media_cfg or HttpConfig())
        self.parsers = parsers or OutputParsers()  # reasoning and tool-call formats of chat answers
        self.max_request_bytes = max_request_bytes
        self.metrics = GatewayMetrics()
        self.tracing = Tracing.off()  # the service sets its process tracer (shared.telemetry) once it has one
        self._api_key = api_key.encode() if api_key else None
        self._created = int(time.time())
        self._chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
        self._completion_decoder = msgspec.json.Decoder(CompletionRequest)
        self._openapi_doc = build_openapi(
            auth=self._api_key is not None, vocab_size=tokenizer.vocab_size, context_length=tokenizer.context_length
        )
        self._routes: dict[str, tuple[str, Handler, bool]] = {  # path -> (method, handler, needs api key)
            "/v1/chat/completions": ("POST", self._chat, True),
            "/v1/completions": ("POST", self._completions, True),
            "/v1/models": ("GET", self._models, True),
            "/tokenize": ("POST", self._tokenize_route, True),
            "/detokenize": ("POST", self._detokenize_route, True),
            "/health": ("GET", self._health, False),
            "/ready": ("GET", self._ready, False),
            "/metrics": ("GET", self._metrics, False),
            "/openapi.json": ("GET", self._openapi_json, False),
        }
        self._extra_models: list[Callable[[], list[ModelCard]]] = []
        self._openapi = b""  # encoded on first request, from _openapi_doc and the routes then mounted

    def add_route(
        self,
        path: str,
        method: str,
        handler: Handler,
        *,
        needs_api_key: bool = True,
        models: Callable[[], list[ModelCard]] | None = None,
    ) -> None:
        """Mount another API beside the built-in routes (e.g. /v1/embeddings, services.gateway.http.embeddings);
        `models` adds its model cards to /v1/models."""
        self._routes[path] = (method, handler, needs_api_key)
        self._openapi = b""  # the document lists the served routes only: encode it again
        if models is not None:
            self._extra_models.append(models)

    @property
    def routes(self) -> dict[str, str]:
        """path -> method, for tests and docs."""
        return {path: method for path, (method, _, _) in self._routes.items()}

    # ------------------------------------------------------------ ASGI entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1003})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.backend.start()
                except Exception as e:
                    log.exception("backend failed to start")
                    await send({"type": "lifespan.startup.failed", "message": f"backend failed to start: {e}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self.backend.close()
                except Exception:
                    log.exception("backend failed to close")
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        r = Responder(send)
        path = scope["path"]
        route = self._routes.get(path)
        try:
            if route is None:
                raise ApiError(404, f"no route {path!r}; see /openapi.json for the API", code="not_found")
            method, handler, needs_key = route
            if scope["method"] != method:
                raise ApiError(
                    405,
                    f"{path} accepts {method}, not {scope['method']}",
                    code="method_not_allowed",
                    headers=((b"allow", method.encode()),),
                )
            if needs_key and self._api_key is not None:
                self._check_api_key(scope)
            if method == "POST":
                check_json_content_type(scope)
            await handler(scope, receive, r)
        except ApiError as e:
            await self._fail(r, e)
        except BackendError as e:  # e.g. raised by a backend's generate() itself, before its first chunk
            await self._fail(r, from_backend(e))
        except ClientDisconnected:
            pass
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the connection or the server is going away: nobody to answer
            # A cancellation the task did not receive (an RPC cut under it): answer it as the error it is.
            log.error("request on %s %s was cut off by a cancelled call", scope.get("method"), path)
            await self._fail(r, internal_error())
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            await self._fail(r, internal_error())
        finally:
            if r.status:
                self.metrics.count_request(path if route is not None else "other", r.status)

    async def _fail(self, r: Responder, err: ApiError) -> None:
        if not r.started:
            await r.error(err)
        elif not r.ended:  # mid-stream: the status line is gone; say it in the stream and end it
            await r.end_stream(sse(err.response()) + DONE)

    def _check_api_key(self, scope: Scope) -> None:
        assert self._api_key is not None
        value = header(scope, b"authorization")
        hint = "send 'Authorization: Bearer <key>' with the key the gateway was started with (--api-key)"
        challenge = ((b"www-authenticate", b"Bearer"),)
        if value is None:
            raise ApiError(401, f"missing API key; {hint}", code="missing_api_key", headers=challenge)
        scheme, _, token = value.partition(b" ")
        # compare_digest: the time taken does not depend on how much of the key matched.
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._api_key):
            raise ApiError(401, f"invalid API key; {hint}", code="invalid_api_key", headers=challenge)

    # ------------------------------------------------------------ small routes

    async def _models(self, scope: Scope, receive: Receive, r: Responder) -> None:
        cards = [
            ModelCard(id=name, created=self._created, root=self.model_root, max_model_len=self.tokenizer.context_length)
            for name in self.served_model_names
        ]
        for more in self._extra_models:
            cards += more()
        try:  # other models the cluster serves (e.g. embedding models), as the backend sees them now
            known = {c.id for c in cards} | {self.model_root}  # the served model also answers to its path
            others = [m for m in self.backend.models() if m not in known]
        except Exception:  # noqa: BLE001 - a listing must not fail because discovery is briefly unhappy
            others = []
        cards += [ModelCard(id=m, created=self._created) for m in sorted(set(others))]
        await r.full(200, _ENC.encode(ModelList(data=cards)))

    async def _tokenize_route(self, scope: Scope, receive: Receive, r: Responder) -> None:
        req = self._decode_small(await read_body(scope, receive, self.max_request_bytes), TokenizeRequest)
        self._resolve_model(req.model)
        await r.full(200, _ENC.encode(tokenize(self.tokenizer, req)))

    async def _detokenize_route(self, scope: Scope, receive: Receive, r: Responder) -> None:
        req = self._decode_small(await read_body(scope, receive, self.max_request_bytes), DetokenizeRequest)
        self._resolve_model(req.model)
        await r.full(200, _ENC.encode(detokenize(self.tokenizer, req)))

    @staticmethod
    def _decode_small(body: bytes, kind: type[T]) -> T:
        try:  # decode_body: `2.0` is a JSON integer, and too deep nesting is a 400, as on the generation routes
            return decode_body(msgspec.json.Decoder(kind), body)
        except msgspec.DecodeError as e:
            raise _decode_error(e) from None

    async def _health(self, scope: Scope, receive: Receive, r: Responder) -> None:
        await r.full(200, _ENC.encode(HealthStatus("ok")))

    async def _ready(self, scope: Scope, receive: Receive, r: Responder) -> None:
        try:
            # Ready: the backend can take a request now, for a model this gateway tokenizes for.
            ready = await self.backend.ready() and any(m in self.served_model_names for m in self.backend.models())
        except Exception as e:  # noqa: BLE001 - any backend failure reads as not ready, and is logged
            log.warning("backend.ready() failed: %s", e)
            ready = False
        if not ready:
            raise ApiError(
                503, "no worker is ready to serve requests yet; retry later", code="not_ready", retry_after_s=1
            )
        await r.full(200, _ENC.encode(HealthStatus("ready")))

    async def _metrics(self, scope: Scope, receive: Receive, r: Responder) -> None:
        await r.full(200, self.metrics.render(), METRICS_CONTENT_TYPE.encode())

    async def _openapi_json(self, scope: Scope, receive: Receive, r: Responder) -> None:
        if not self._openapi:  # the document describes mountable routes too (/v1/embeddings): list the served ones
            paths = {p: op for p, op in self._openapi_doc["paths"].items() if p in self._routes}
            self._openapi = _ENC.encode({**self._openapi_doc, "paths": paths})
        await r.full(200, self._openapi)

    # ------------------------------------------------------------ generation

    async def _chat(self, scope: Scope, receive: Receive, r: Responder) -> None:
        await self._traced(scope, receive, r, ApiKind.CHAT)

    async def _completions(self, scope: Scope, receive: Receive, r: Responder) -> None:
        await self._traced(scope, receive, r, ApiKind.COMPLETION)

    async def _traced(self, scope: Scope, receive: Receive, r: Responder, kind: ApiKind) -> None:
        """`_generate` in the gateway.request span: a child of the client's traceparent header, if it sent one, and
        the current span while the request runs (route, decode call and NATS cancels are its children)."""
        tr = self.tracing
        if not tr.enabled:
            await self._generate(scope, receive, r, kind)
            return
        parent = extract((k.decode(), v.decode("latin-1")) for k, v in scope["headers"] if k in _TRACE_HEADERS)
        span = tr.start_span(
            spans.GATEWAY_REQUEST,
            parent=parent or Context(),
            kind=SpanKind.SERVER,
            attributes={spans.HTTP_ROUTE: scope["path"]},
        )
        token = tr.activate(span)
        status = 0
        try:
            await self._generate(scope, receive, r, kind)
        except ApiError as e:
            status = e.status
            if status >= 500:
                set_error(span, e.message)
            raise
        except BackendError as e:
            status = from_backend(e).status
            set_error(span, str(e))
            raise
        except ClientDisconnected:
            span.set_attribute("pdrelay.client_disconnected", True)
            raise
        except Exception as e:
            status = 500
            set_error(span, f"{type(e).__name__}: {e}")
            raise
        finally:
            span.set_attribute(spans.HTTP_STATUS, status or r.status)
            tr.deactivate(token)
            tr.end(span)

    async def _generate(self, scope: Scope, receive: Receive, r: Responder, kind: ApiKind) -> None:
        arrival = time.perf_counter()
        plan = self._plan(kind, await read_body(scope, receive, self.max_request_bytes))
        model = self._resolve_model(plan.model)
        rid = ("chatcmpl-" if kind is ApiKind.CHAT else "cmpl-") + uuid.uuid4().hex
        trace = tuple((k.decode(), v.decode("latin-1")) for k, v in scope["headers"] if k in _TRACE_HEADERS)
        reqs = await self._backend_requests(plan, model, rid, trace)
        bind_request_id(reqs[0].request_id)  # log lines of this request (its task's own context) carry the id
        span = current_span()
        if span.is_recording():
            span.set_attributes({spans.REQUEST_ID: reqs[0].request_id, spans.MODEL: model})
            n_prompt = sum(len(q.prompt_token_ids) for q in reqs)
            attrs = {spans.PROMPT_TOKENS: n_prompt}
            self.tracing.record(spans.GATEWAY_TOKENIZE, perf_to_mono(arrival), time.monotonic(), attrs, parent=span)
        fmt = formatter_for(plan, kind, reqs, self.tokenizer, rid, model, self.parsers)
        gens = [
            Generation(
                self.backend,
                self.tokenizer,
                q,
                skip_special_tokens=plan.skip_special_tokens
                and not (kind is ApiKind.CHAT and self.parsers.keeps_special_tokens),
                metrics=self.metrics,
                arrival=arrival,
            )
            for q in reqs
        ]
        gen: Generation | BatchGeneration = gens[0] if len(gens) == 1 else BatchGeneration(gens, reqs[0].sampling.n)
        self.metrics.started(gen.num_prompt_tokens)
        try:
            await cancel_on_disconnect(respond(gen, plan, fmt, r), receive)
        finally:
            self.metrics.ended(gen.num_prompt_tokens, gen.num_generated)
            if r.ended and r.status == 200:
                self.metrics.e2e.observe(time.perf_counter() - arrival)
            if span.is_recording():
                _annotate(span, gen, arrival)

    def _plan(self, kind: ApiKind, body: bytes) -> Plan:
        """The request body decoded, type-checked and planned (a 400 naming the field otherwise)."""
        vocab = self.tokenizer.vocab_size
        try:
            if kind is ApiKind.CHAT:
                req = decode_body(self._chat_decoder, body)
                return plan_chat(
                    req,
                    vocab_size=vocab,
                    image_placeholder=self.media.placeholder,
                    max_tool_calls=self.parsers.max_parallel_tool_calls,
                )
            return plan_completion(decode_body(self._completion_decoder, body), vocab_size=vocab)
        except msgspec.DecodeError as e:
            raise _decode_error(e) from None

    async def _backend_requests(
        self, plan: Plan, model: str, rid: str, trace: tuple[tuple[str, str], ...]
    ) -> list[BackendRequest]:
        """One backend request per prompt (a completions request may send a list): tokenized, its images decoded,
        hashed and expanded into the prompt, its sampling fitted to the context."""
        reqs: list[BackendRequest] = []
        tok = self.tokenizer
        for p, one in enumerate(plan.batch or (plan,)):
            param = "messages" if one.kind is ApiKind.CHAT else "prompt"
            ids = prompt_ids(one, tok, template_param="messages", prompt_param=param)
            ids, media = await self.media.attach(one.image_urls, ids)  # images: decoded, hashed, expanded
            reqs.append(
                BackendRequest(
                    request_id=rid if not plan.batch else f"{rid}-{p}",
                    model=model,
                    prompt_token_ids=ids,
                    sampling=fit_context(one.sampling, len(ids), tok.context_length, prompt_param=param),
                    trace_headers=trace,
                    priority=plan.priority,
                    media=media,
                )
            )
        return reqs

    def _resolve_model(self, requested: str | None) -> str:
        if requested is None:
            return self.served_model_names[0]
        model = self._model_names.get(requested)
        if model is None:
            raise ApiError(
                404,
                f"model {requested!r} is not served here; GET /v1/models lists: {', '.join(self.served_model_names)}",
                param="model",
                code="model_not_found",
            )
        return model
