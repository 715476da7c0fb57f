"""One request's trip through the backend: token-id chunks in, text deltas out, stop strings enforced.

The gateway is authoritative for stop strings: when one matches, the output is cut before it, finish_reason
becomes "stop", and the backend stream is closed (`aclose()`), which tells the worker to abort. The same
happens on client disconnect, because the task awaiting `next()` is cancelled and `aclose()` runs in the
caller's `finally`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from services.gateway.backend import (
    BackendChunk,
    BackendError,
    BackendRequest,
    FinishReason,
    GenerateBackend,
    TokenLogprob,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.text.detokenizer import IncrementalDetokenizer
from services.gateway.text.tokenizer import GatewayTokenizer


class Delta:
    """Text (and logprobs) to send now. finish_reason is set on the last one."""

    __slots__ = ("text", "logprobs", "text_offset", "finish_reason", "stop_reason", "index", "prompt")

    def __init__(
        self,
        text: str,
        logprobs: tuple[TokenLogprob, ...] | None,
        text_offset: int,
        finish_reason: FinishReason | None = None,
        stop_reason: int | str | None = None,
        index: int = 0,
    ) -> None:
        self.index = index  # the choice this delta belongs to (n > 1, batched prompts)
        self.text = text
        self.logprobs = logprobs
        self.text_offset = text_offset  # characters of output before this delta (completions text_offset)
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        # echo + logprobs, first delta of each sample: (token id, logprob entry) per prompt token, None for the first
        self.prompt: tuple[tuple[int, TokenLogprob | None], ...] | None = None


class Generation:
    """Per-request state. Call `next()` until `finished` (n = 1: the Delta with finish_reason; n > 1: one such
    Delta per sample, `index` saying which); always `aclose()`."""

    def __init__(
        self,
        backend: GenerateBackend,
        tokenizer: GatewayTokenizer,
        req: BackendRequest,
        *,
        skip_special_tokens: bool,
        metrics: GatewayMetrics,
        arrival: float,
    ) -> None:
        self.request = req
        self._stream: AsyncIterator[BackendChunk] = backend.generate(req)

        def detok() -> IncrementalDetokenizer:
            return IncrementalDetokenizer(
                tokenizer.fast,
                prompt_token_ids=req.prompt_token_ids,
                skip_special_tokens=skip_special_tokens,
                stop=req.sampling.stop,
                include_stop_str_in_output=req.sampling.include_stop_str_in_output,
            )

        self._detoks = [detok() for _ in range(max(1, req.sampling.n))]
        self._done: set[int] = set()
        self._metrics = metrics
        self._arrival = arrival
        self._last_token_at: float | None = None
        self.num_prompt_tokens = len(req.prompt_token_ids)
        self.num_cached_tokens = 0
        self.num_generated = 0
        self.finished = False
        self.first_token_at: float | None = None
        self._prompt_lps: tuple[tuple[int, TokenLogprob | None], ...] | None = None
        self._prompt_sent: set[int] = set()  # samples whose first delta carried the prompt logprobs

    async def next(self) -> Delta:
        """The next delta with something to say (text, logprobs or the end). Raises BackendError."""
        assert not self.finished, "next() after the last delta"
        while True:
            try:
                chunk = await self._stream.__anext__()
            except StopAsyncIteration:
                raise BackendError("the backend stream ended without a finish reason") from None
            if chunk.prompt_logprobs is not None and self._prompt_lps is None:
                ids = self.request.prompt_token_ids
                self._prompt_lps = tuple(zip(ids, (None, *chunk.prompt_logprobs), strict=True))
            delta = self._on_chunk(chunk)
            if delta is not None:
                if self._prompt_lps is not None and delta.index not in self._prompt_sent:
                    self._prompt_sent.add(delta.index)  # n > 1: every sample's choice echoes the same prompt
                    delta.prompt = self._prompt_lps
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
        i = chunk.index
        if not 0 <= i < len(self._detoks):
            raise BackendError(f"the backend sent sample {i} of a request with n={len(self._detoks)}")
        if i in self._done:
            return None  # the gateway ended this sample at a stop string; the worker is still winding it down
        detok = self._detoks[i]
        offset = detok.text_len
        scan = detok.step(chunk.token_ids)
        if scan.matched is not None:
            self._end(i)
            return Delta(scan.text, chunk.logprobs, offset, "stop", scan.matched, i)
        if chunk.finish_reason is not None:
            self._end(i)
            return Delta(scan.text + detok.finish(), chunk.logprobs, offset, chunk.finish_reason, chunk.stop_reason, i)
        if scan.text or chunk.logprobs:
            return Delta(scan.text, chunk.logprobs, offset, index=i)
        return None

    def _end(self, index: int) -> None:
        self._done.add(index)
        self.finished = len(self._done) == len(self._detoks)

    async def aclose(self) -> None:
        """Close the backend stream (aborts the request on the worker when it is still running)."""
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()
