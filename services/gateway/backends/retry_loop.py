"""RetryLoop: one request's attempts over the cluster, the gateway's half of "nothing lost on failure".

It holds what outlives a single attempt and decides, after each failed one, whether there is another:

    replay     the output tokens already handed to the client (`sent`): the next attempt's prompt is the original
               prompt + those tokens, its max_tokens shrinks by as many, so the client sees one stream
    exclude    instances that failed or refused this request (the router avoids them; a refused hand-off
               excludes the pair's prefill, so the decode may be kept and the pair is chosen again)
    budget     failures (hand-off, server) count against `--request-retries`; refusals (overloaded, draining)
               are bounded by the number of instances instead
    verdict    a request that can never succeed (invalid, unknown model, failed alone on a healthy instance) is
               not retried: its error goes to the client

The decode side has its own loop over prefills for one hand-off (services/decode/remote_prefill.py,
`RemotePrefillClient.run`); this one re-chooses the whole pair. docs/architecture.md has both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
from services.gateway.routing.failures import FailureKind, Verdict
from services.gateway.routing.router import NoRoute, NoRouteReason
from services.gateway.routing.views import RouteRequest
from shared.cluster.sampling_pb import remaining_max_tokens


@dataclass
class RetryLoop:
    req: BackendRequest
    retries: int  # failures allowed after the first (--request-retries)
    retry_after_s: float = 1.0
    breaker_cooldown_s: float = 0.0
    sent: list[int] = field(default_factory=list)  # n == 1: output tokens handed to the client, over all attempts
    streamed: bool = False  # some tokens went to the client (an n > 1 stream cannot be replayed then)
    done_samples: set[int] = field(default_factory=set)  # n > 1: samples finished so far
    exclude: set[str] = field(default_factory=set)
    verdicts: list[Verdict] = field(default_factory=list)
    failures: int = 0
    attempt: int = 0
    completed: bool = False

    def route_request(self) -> RouteRequest | None:
        """What the next attempt asks the router for; None when every token was already sent (the last message
        was lost with its instance): the request is complete."""
        left = remaining_max_tokens(self.req.sampling, len(self.sent))
        if left == 0:
            return None
        return RouteRequest(self.req.request_id, (*self.req.prompt_token_ids, *self.sent), left)

    def final_chunk(self) -> BackendChunk:
        """The chunk that ends a request whose every token was sent before its instance went away."""
        self.completed = True
        return BackendChunk((), None, "length", None, len(self.req.prompt_token_ids), None)

    @property
    def first(self) -> bool:
        """Nothing reached the client yet: the next chunk is its first (it carries the prompt logprobs)."""
        return not self.sent and not self.streamed

    def took(self, chunk: BackendChunk) -> None:
        """A chunk is on its way to the client."""
        if self.req.sampling.n == 1:
            self.sent.extend(chunk.token_ids)
        self.streamed = self.streamed or bool(chunk.token_ids)
        if chunk.finish_reason is not None:
            self.done_samples.add(chunk.index)
            self.completed = len(self.done_samples) >= self.req.sampling.n

    def failed(self, verdict: Verdict, where: str) -> bool:
        """An attempt failed with `verdict`: raise the error the client gets, or return (another attempt follows)
        whether the failure used the retry budget."""
        self.verdicts.append(verdict)
        if not verdict.retryable:
            raise final_error(verdict)
        n = self.req.sampling.n
        if self.streamed and n > 1:
            raise BackendUnavailable(
                f"the stream of {n} samples broke after tokens were sent ({verdict.message});"
                " n > 1 streams are not replayed, retry the request",
                retry_after_s=self.retry_after_s,
            )
        self.exclude |= verdict.exclude
        if verdict.uses_retry_budget:
            self.failures += 1
            if self.failures > self.retries:
                raise BackendUnavailable(
                    f"request failed {self.failures} times (last on {where}: {verdict.message}); "
                    f"the gateway retries {self.retries} times (--request-retries)",
                    retry_after_s=self.retry_after_s,
                )
        self.attempt += 1
        return verdict.uses_retry_budget

    def no_route(self, e: NoRoute) -> BackendError:
        """The error for a request no instance can take now (after the attempts so far)."""
        kinds = {v.kind for v in self.verdicts}
        model = self.req.model
        if e.reason is NoRouteReason.EXCLUDED and FailureKind.OVERLOADED in kinds and not self.sent:
            return BackendOverloaded(
                f"every instance serving {model!r} is at capacity ({self.verdicts[-1].message})",
                retry_after_s=self.retry_after_s,
            )
        detail = f"; last failure: {self.verdicts[-1].message}" if self.verdicts else ""
        if e.reason is NoRouteReason.NONE_READY:
            return BackendUnavailable(
                f"no instance serving {model!r} is ready ({e}){detail}", retry_after_s=self.retry_after_s
            )
        wait = self.retry_after_s
        if e.reason is NoRouteReason.BREAKERS_OPEN:
            wait = max(wait, self.breaker_cooldown_s)
        return BackendUnavailable(f"{e}{detail}", retry_after_s=wait)


def final_error(verdict: Verdict) -> BackendError:
    """The client's error for a verdict that ends the request."""
    if verdict.kind == FailureKind.NOT_FOUND:
        return ModelNotFound(verdict.message)
    if verdict.kind == FailureKind.REQUEST:
        return RequestFailed(verdict.message)
    return InvalidRequest(verdict.message)
