"""A fast, deterministic stand-in for the worker fleet: tests and the `--mock-workers` serving benchmark.

It "generates" by echoing: the output is `output_token_ids` if given, else the prompt's own tokens, cycled up
to max_tokens. Every chunk can be delayed (first_token_delay_s for prefill, token_delay_s per decode step), so
a benchmark sees a realistic TTFT/ITL shape without a model. It records what it saw (requests, which ones
finished, which ones were cancelled) so tests can observe cancellation propagating from the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from services.gateway.backend import (
    BackendChunk,
    BackendRequest,
    FinishReason,
    TokenLogprob,
    TopLogprob,
)

_LOGPROB_STEP = 0.125  # alternatives are spaced this far apart in logprob (exact in binary: no rounding noise)


class MockBackend:
    """Implements `GenerateBackend` without workers. Not thread-safe; one event loop."""

    def __init__(
        self,
        models: Sequence[str] = ("mock",),
        *,
        token_delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
        output_token_ids: Sequence[int] | None = None,
        tokens_per_chunk: int = 1,
        eos_token_ids: Sequence[int] = (),
        vocab_size: int = 1 << 16,
        cached_tokens: int = 0,
    ) -> None:
        if tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be >= 1 (got {tokens_per_chunk})")
        self._models = list(models)
        self.token_delay_s = token_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.output_token_ids = tuple(output_token_ids) if output_token_ids is not None else None
        self.tokens_per_chunk = tokens_per_chunk
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.cached_tokens = cached_tokens
        self.is_ready = True
        # Exceptions raised by the next generate() calls, in order (fault injection for error-path tests).
        self.fail_next: list[BaseException] = []
        self.requests: list[BackendRequest] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.cancelled_event = asyncio.Event()
        self.started = False
        self.closed = False

    # ------------------------------------------------------------ GenerateBackend

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def ready(self) -> bool:
        return self.is_ready

    def models(self) -> list[str]:
        return list(self._models)

    def generate(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        self.requests.append(req)
        if self.fail_next:
            # Raise on the first __anext__, as a real backend does when admission fails.
            return self._fail(self.fail_next.pop(0))
        return self._generate(req)

    # ------------------------------------------------------------ internals

    async def _fail(self, exc: BaseException) -> AsyncIterator[BackendChunk]:
        raise exc
        yield  # pragma: no cover  (makes this an async generator)

    def output_for(self, req: BackendRequest) -> list[int]:
        """The token ids this mock will generate for `req` if nothing stops it early (tests use it as truth)."""
        source = self.output_token_ids if self.output_token_ids is not None else req.prompt_token_ids
        max_tokens = req.sampling.max_tokens if req.sampling.max_tokens is not None else 64
        if not source:
            return []
        return [source[i % len(source)] for i in range(max_tokens)]

    def _logprob(self, token_id: int, k: int | None, position: int) -> TokenLogprob:
        # Deterministic and self-consistent: the sampled token is the most likely one, alternatives follow.
        chosen = -_LOGPROB_STEP * (1 + position % 4)
        tops: tuple[TopLogprob, ...] = ()
        if k:
            tops = tuple(TopLogprob((token_id + j) % self.vocab_size, chosen - _LOGPROB_STEP * j) for j in range(k))
        return TokenLogprob(token_id, chosen, tops)

    async def _generate(self, req: BackendRequest) -> AsyncIterator[BackendChunk]:
        sp = req.sampling
        tokens = self.output_for(req)
        stop_ids = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(self.eos_token_ids))
        n_prompt = len(req.prompt_token_ids)
        n_cached = min(self.cached_tokens, n_prompt)
        completed = False
        try:
            if self.first_token_delay_s > 0:
                await asyncio.sleep(self.first_token_delay_s)
            pos = 0
            if not tokens:
                completed = True
                yield BackendChunk((), None, "length", None, n_prompt, n_cached)
                return
            while pos < len(tokens):
                if pos > 0:
                    # Always yield to the loop between steps, as a real stream does (lets cancellation in).
                    await asyncio.sleep(self.token_delay_s)
                step = tokens[pos : pos + self.tokens_per_chunk]
                finish: FinishReason | None = None
                stop_reason: int | None = None
                for i, t in enumerate(step):
                    if t in stop_ids and pos + i + 1 >= sp.min_tokens:
                        step = step[: i + 1]
                        finish, stop_reason = "stop", t
                        break
                pos += len(step)
                if finish is None and pos >= len(tokens):
                    finish = "length"
                logprobs = None
                if sp.logprobs is not None:
                    logprobs = tuple(self._logprob(t, sp.logprobs, pos - len(step) + i) for i, t in enumerate(step))
                if finish is not None:
                    completed = True
                for index in range(max(1, sp.n)):  # n > 1: every sample is the same stream here
                    yield BackendChunk(tuple(step), logprobs, finish, stop_reason, n_prompt, n_cached, index)
                if finish is not None:
                    return
        finally:
            # GeneratorExit (aclose) or CancelledError land here before completion: the client went away.
            if completed:
                self.finished.append(req.request_id)
            else:
                self.cancelled.append(req.request_id)
                self.cancelled_event.set()
