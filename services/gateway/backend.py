"""The seam between the gateway's front doors (HTTP and gRPC) and whatever generates tokens.

The gateway validates, tokenizes and detokenizes; a `GenerateBackend` turns prompt token ids into a stream of
token-id deltas. The product's is `GrpcBackend` (backends/grpc_backend.py: discovery, prefill/decode pair
selection, retries over the decode / worker instances); `MockBackend` (mock/) stands in for the workers in tests
and the `--mock-workers` benchmarks. Neither front door knows which one it talks to.

Cancellation is part of the contract: the gateway closes the async generator returned by `generate`
(`aclose()`, or cancels the task awaiting it) when the client disconnects or a stop string matched. An
implementation must treat `GeneratorExit` / `asyncio.CancelledError` at a `yield` / `await` as "abort this
request" and tell its worker, so no compute is spent on output nobody reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from shared.modelspec.image_processor import RAW_RGB_MIME
from shared.modelspec.sampling import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class PromptImage:
    """One image of a tokenized prompt: positions [offset, offset + num_tokens), hash, fitted pixels."""

    media_hash: str
    data: bytes  # uint8 [H, W, 3] (RAW_RGB_MIME)
    offset: int
    num_tokens: int
    mime_type: str = RAW_RGB_MIME


@dataclass(frozen=True, kw_only=True)
class BackendRequest:
    """One generation request, already tokenized. request_id is unique per client request; a backend that
    retries on another worker keeps it (idempotency) and bumps its own attempt counter."""

    request_id: str
    model: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams  # the engine's own type (shared/modelspec/sampling.py), planned by the gateway
    # W3C trace context headers received from the client ("traceparent", "tracestate"), lower-case names.
    trace_headers: tuple[tuple[str, str], ...] = ()
    priority: int = 0  # lower is served first under the workers' "priority" policy
    media: tuple[PromptImage, ...] = ()  # images at their (expanded) placeholder positions, in prompt order


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Logprob of one generated token and the most likely alternatives at its position (best first)."""

    token_id: int
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()
    rank: int = 0  # of token_id in the vocabulary, 1 = most likely; 0 = not computed (prompt logprobs have it)


@dataclass(frozen=True, slots=True)
class BackendChunk:
    """New tokens since the previous chunk (usually one decode step).

    logprobs: one entry per new token when the request asked for logprobs, else None.
    finish_reason: set on the last chunk only. stop_reason: the stop token id or stop string that ended it.
    num_prompt_tokens / num_cached_tokens: None when this chunk does not know them (the gateway keeps the last
    value seen; cached tokens are prompt tokens whose KV came from a prefix cache of any tier).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    index: int = 0  # which sample (n > 1); finish_reason ends that sample only
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # prompt tokens 1.. (first chunk, when asked for)


# ----------------------------------------------------------- typed errors (mapped to HTTP in http/errors.py)


class BackendError(Exception):
    """A backend failure that is not the client's fault (HTTP 500 unless a subclass says otherwise)."""

    retry_after_s: float | None = None


class InvalidRequest(BackendError):
    """The request can never be served as sent (HTTP 400). `param` names the offending field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(BackendError):
    """No worker serves the requested model (HTTP 404)."""


class BackendOverloaded(BackendError):
    """Every worker that could take the request is full (HTTP 429, or 503 with status=503); retry later."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0, status: Literal[429, 503] = 429) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status = status


class BackendUnavailable(BackendError):
    """No worker is reachable right now (HTTP 503); retry later."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BackendTimeout(BackendError):
    """A worker did not answer in time (HTTP 504)."""


class RequestFailed(BackendError):
    """Processing this one request failed on its worker (its logits processing, grammar, detokenizing), which went
    on serving the others (HTTP 500 naming the reason). Not retried elsewhere, where it would fail the same way."""


@runtime_checkable
class GenerateBackend(Protocol):
    """What the HTTP layer needs from the token generators behind it."""

    def generate(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        """Stream the request's token deltas; the last chunk has finish_reason set.

        Usually an `async def` generator. Errors before the first chunk become HTTP error responses; errors
        after it end the stream with an error event. Raise the typed errors above.
        """
        ...

    async def ready(self) -> bool:
        """True when a request sent now could be served (GET /ready)."""
        ...

    def models(self) -> list[str]:
        """Served model names the backend can route to right now."""
        ...

    async def start(self) -> None:
        """Called once when the server starts (connect, discover workers)."""
        ...

    async def close(self) -> None:
        """Called once when the server stops; must not raise."""
        ...
