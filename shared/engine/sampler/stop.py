"""When a request stops, and the text it emits: EOS, stop token ids, stop strings, max_tokens, context length.

Stop strings are matched on detokenized text, so one spanning several tokens still stops the request; the
output text is cut before the match (or after it with include_stop_str_in_output). While a request runs, the
last len(longest stop string) - 1 characters are held back, because they might yet become a stop string.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.engine.request import FinishReason, Request
from shared.engine.sampler.text_window import DecodeFn, TextWindow


@dataclass(frozen=True)
class StopResult:
    finish_reason: FinishReason | None
    stop_reason: int | str | None
    new_text: str


class StopChecker:
    def __init__(
        self, *, eos_token_ids: Iterable[int] = (), max_model_len: int, decode_fn: DecodeFn | None = None
    ) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.decode_fn = decode_fn

    def check(self, req: Request) -> StopResult:
        """Call after req.append_output(token); returns why the request finished (if it did) and its new text."""
        p = req.params
        tok = req.output_token_ids[-1]
        n_out = req.num_output_tokens
        prev_len = len(req.output_text)
        if self.decode_fn is not None:
            if req.detokenizer is None:
                req.detokenizer = TextWindow(self.decode_fn, req.prompt_token_ids)
            req.output_text += req.detokenizer.step(tok)

        reason: FinishReason | None = None
        stop: int | str | None = None
        if n_out >= p.min_tokens:
            if not p.ignore_eos and tok in self.eos_token_ids:
                reason = "stop"
            elif tok in p.stop_token_ids:
                reason, stop = "stop", tok
            elif p.stop and self.decode_fn is not None:
                hit = _find_stop(req.output_text, p.stop, prev_len)
                if hit is not None:
                    idx, s = hit
                    reason, stop = "stop", s
                    req.output_text = req.output_text[: idx + len(s) if p.include_stop_str_in_output else idx]
        if reason is None and (
            (p.max_tokens is not None and n_out >= p.max_tokens) or req.num_tokens >= self.max_model_len
        ):
            reason = "length"

        if reason is not None:
            if req.detokenizer is not None and not isinstance(stop, str):  # emit a trailing partial character
                req.output_text += req.detokenizer.flush()
            upto = len(req.output_text)
        else:
            hold = max(map(len, p.stop)) - 1 if p.stop and not p.include_stop_str_in_output else 0
            upto = max(req.num_text_emitted, len(req.output_text) - hold)
        new_text = req.output_text[req.num_text_emitted : upto]
        req.num_text_emitted = upto
        return StopResult(reason, stop, new_text)


def _find_stop(text: str, stops: tuple[str, ...], prev_len: int) -> tuple[int, str] | None:
    """Earliest stop string occurrence that ends after prev_len (earlier text was already checked)."""
    best: tuple[int, str] | None = None
    for s in stops:
        idx = text.find(s, max(0, prev_len - len(s) + 1))
        if idx != -1 and (best is None or idx < best[0]):
            best = (idx, s)
    return best
