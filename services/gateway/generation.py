"""One request's trip through the backend: token-id chunks in, text deltas out, stop strings enforced.

The gateway is authoritative for stop strings: when one matches, the output is cut before it, finish_reason
becomes "stop", and the backend stream is closed (`aclose()`), which tells the worker to abort. The same
happens on client disconnect, because the task awaiting `next()` is cancelled and `aclose()` runs in the
caller's `finally`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from services.gateway.backend import BackendChunk, BackendError, BackendRequest, GenerateBackend, TokenLogprob
from services.gateway.detokenizer import IncrementalDetokenizer
from services.gateway.metrics import GatewayMetrics
from services.gateway.tokenizer import GatewayTokenizer


class Delta:
    """Text (and logprobs) to send now. finish_reason is set on the last one."""

    __slots__ = ("text", "logprobs", "text_offset", "finish_reason", "stop_reason")

    def __init__(self, text: str, logprobs: tuple[TokenLogprob, ...] | None, text_offset: int,
                 finish_reason: str | None = None, stop_reason: int | str | None = None) -> None:
        self.text = text
        self.logprobs = logprobs
        self.text_offset = text_offset  # characters of output before this delta (completions text_offset)
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason


class Generation:
    """Per-request state. Call `next()` until it returns a Delta with finish_reason; always `aclose()`."""

    def __init__(self, backend: GenerateBackend, tokenizer: GatewayTokenizer, req: BackendRequest, *,
                 skip_special_tokens: bool, metrics: GatewayMetrics, arrival: float) -> None:
        self.request = req
        self._stream: AsyncIterator[BackendChunk] = backend.generate(req)
        self._detok = IncrementalDetokenizer(
            tokenizer.fast, prompt_token_ids=req.prompt_token_ids, skip_special_tokens=skip_special_tokens,
            stop=req.sampling.stop, include_stop_str_in_output=req.sampling.include_stop_str_in_output,
        )
        self._metrics = metrics
        self._arrival = arrival
        self._last_token_at: float | None = None
        self.num_prompt_tokens = len(req.prompt_token_ids)
        self.num_cached_tokens = 0
        self.num_generated = 0
        self.finished = False
        self.first_token_at: float | None = None

    async def next(self) -> Delta:
        """The next delta with something to say (text, logprobs or the end). Raises BackendError."""
        assert not self.finished, "next() after the last delta"
        while True:
            try:
                chunk = await self._stream.__anext__()
            except StopAsyncIteration:
                raise BackendError("the backend stream ended without a finish reason") from None
            delta = self._on_chunk(chunk)
            if delta is not None:
                return delta

    def _on_chunk(self, chunk: BackendChunk) -> Delta | None:
        now = time.perf_counter()
        if chunk.num_prompt_tokens is not None:
            self.num_prompt_tokens = chunk.num_prompt_tokens
        if chunk.num_cached_tokens is not None:
            self.num_cached_tokens = chunk.num_cached_tokens
        if chunk.token_ids:
            if self._last_token_at is None:
                self.first_token_at = now
                self._metrics.ttft.observe(now - self._arrival)
            else:
                self._metrics.itl.observe(now - self._last_token_at)
            self._last_token_at = now
            self.num_generated += len(chunk.token_ids)
        offset = self._detok.text_len
        scan = self._detok.step(chunk.token_ids)
        if scan.matched is not None:
            self.finished = True
            return Delta(scan.text, chunk.logprobs, offset, "stop", scan.matched)
        if chunk.finish_reason is not None:
            self.finished = True
            return Delta(scan.text + self._detok.finish(), chunk.logprobs, offset, chunk.finish_reason,
                         chunk.stop_reason)
        if scan.text or chunk.logprobs:
            return Delta(scan.text, chunk.logprobs, offset)
        return None

    async def aclose(self) -> None:
        """Close the backend stream (aborts the request on the worker when it is still running)."""
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()
