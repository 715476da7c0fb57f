"""Incremental detokenization that is safe for multi-byte characters and leading-space tokens.

Decoding one token at a time is wrong for byte-level BPE (a character may span tokens: the partial decode ends
in U+FFFD) and for SentencePiece (a token's leading space depends on what precedes it). So we decode a short
window twice, [prefix, read) and [prefix, end), and emit the difference once it is complete (vLLM / HF
TextStreamer approach). Cost per token is O(window), not O(sequence).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

DecodeFn = Callable[[Sequence[int]], str]

_CONTEXT_TOKENS = 5  # prompt tokens kept as left context so the first output token decodes as in the full text


class TextWindow:
    def __init__(self, decode_fn: DecodeFn, context_ids: Sequence[int] = ()) -> None:
        self._decode = decode_fn
        self._ids: list[int] = list(context_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0  # window start: tokens before it are already emitted and no longer needed as context
        self._read = len(self._ids)  # tokens before it are emitted

    def step(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a multi-byte character is still partial)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Text still held back (an incomplete character at the end of the stream), emitted as is."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        delta = new_text[len(prefix_text) :]
        # Slide the window: the tokens just emitted become the left context of the next decode; older ids go.
        self._prefix, self._read = self._read, len(self._ids)
        del self._ids[: self._prefix]
        self._read -= self._prefix
        self._prefix = 0
        return delta
