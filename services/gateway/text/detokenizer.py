"""Incremental detokenization: token-id deltas in, complete UTF-8 text out, stop strings enforced.

A character may span several tokens (byte-level BPE, SentencePiece byte fallback): decoding tokens one by one
would emit U+FFFD halves. `tokenizers.decoders.DecodeStream` (Rust, ~1 us per token) keeps a short window and
only returns text once it is complete. It raises when a tokenizer's decoding of the window is not
prefix-stable (rare cleanup rules); then we fall back to the same window algorithm in Python over
`Tokenizer.decode`. Both are O(new tokens) amortized: the window restarts after each emitted piece.

The last few prompt tokens seed the window so that the first generated token decodes as it would in the full
text (SentencePiece drops a leading space at the start of a sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

from services.gateway.text.stop_strings import StopScan, StopStringMatcher

_CONTEXT_TOKENS = 4


class _WindowDecoder:
    """vLLM-style [prefix, read) window over Tokenizer.decode; used only when DecodeStream cannot be."""

    def __init__(self, tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids = ids
        self._prefix = 0
        self._read = len(ids)

    def step(self, token_ids: Sequence[int]) -> str | None:
        self._ids.extend(token_ids)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], skip_special_tokens=self._skip)
        new_text = self._tok.decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None  # incomplete character (or nothing visible yet): wait for more tokens
        self._prefix, self._read = self._read, len(self._ids)
        return new_text[len(prefix_text) :]


class IncrementalDetokenizer:
    """Per-request state. `step()` each chunk of new token ids; `finish()` once when the stream ends."""

    __slots__ = ("_tok", "_skip", "_stream", "_fallback", "_context", "_unemitted", "_stops", "stopped", "text_len")

    def __init__(
        self,
        tokenizer: Any,  # tokenizers.Tokenizer
        *,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._stream: DecodeStream | None = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
        self._fallback: _WindowDecoder | None = None
        # Enough to rebuild the window on fallback: the tail of what was emitted, and what was not yet.
        self._context: list[int] = context
        self._unemitted: list[int] = []
        self._stops = StopStringMatcher(stop, include_stop_str_in_output=include_stop_str_in_output)
        self.stopped: str | None = None  # the stop string that ended the output
        self.text_len = 0  # characters emitted so far

    def step(self, token_ids: Sequence[int]) -> StopScan:
        """Decode new tokens. Returns the text that is safe to emit now and the stop string if one matched;
        after a match the caller must stop the stream (further tokens are not part of the output)."""
        assert self.stopped is None, "step() after a stop string matched"
        if not token_ids:
            return StopScan("", None)
        piece = self._decode(token_ids)
        scan = self._stops.feed(piece) if piece else StopScan("", None)
        self.stopped = scan.matched
        self.text_len += len(scan.text)
        return scan

    def finish(self) -> str:
        """Text held back for a possible stop string, once the stream ended without one. A character that was
        cut by max_tokens (incomplete bytes) is dropped rather than emitted as U+FFFD."""
        if self.stopped is not None:
            return ""
        tail = self._stops.flush()
        self.text_len += len(tail)
        return tail

    def _decode(self, token_ids: Sequence[int]) -> str:
        if self._fallback is None:
            assert self._stream is not None
            try:
                out = self._stream.step(self._tok, list(token_ids))
            except Exception:  # noqa: BLE001 - the tokenizers library raises plain exceptions here
                # Prefix-unstable decoding; rebuild the window in Python from the tokens not yet emitted.
                self._stream = None
                self._fallback = _WindowDecoder(self._tok, self._context, self._skip)
                return self._fallback.step([*self._unemitted, *token_ids]) or ""
            if out is None:
                self._unemitted.extend(token_ids)
                return ""
            self._context = [*self._unemitted, *token_ids][-_CONTEXT_TOKENS:]
            self._unemitted = []
            return out
        return self._fallback.step(token_ids) or ""
