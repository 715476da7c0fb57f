"""The mock engine's timing model: how long one engine step takes, from what the step computes.

A step is described by three numbers the scheduler's output gives away: prompt tokens computed (prefill chunks),
the number of decoding sequences, and their total context. The table holds step times measured on the real
engine (shared/engine/mock/fit.py writes it), and predictions interpolate between measured points:

    prefill only    prefill_ms(tokens)                      piecewise linear over the measured token counts
    decode only     decode_ms(batch, mean context)          bilinear over the measured (batch, context) grid
    mixed           prefill_ms(tokens + batch) + decode_ms(batch, ctx) - decode_ms(batch, smallest ctx)

A mixed step runs the decode rows through the same GEMMs as the prompt tokens (so they count as tokens there) and
adds only what their attention over the context costs. Outside the grid the end segments are extended linearly.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

import msgspec

DEFAULT_TABLE = Path(__file__).with_name("table.json")


class PrefillTable(msgspec.Struct, frozen=True, kw_only=True):
    tokens: tuple[int, ...]  # prompt tokens in the step, increasing
    ms: tuple[float, ...]  # measured step time for each


class DecodeTable(msgspec.Struct, frozen=True, kw_only=True):
    batch: tuple[int, ...]  # decoding sequences, increasing
    context: tuple[int, ...]  # mean context per sequence (tokens), increasing
    ms: tuple[tuple[float, ...], ...]  # [len(batch)][len(context)] measured step time


class TimingTable(msgspec.Struct, frozen=True, kw_only=True):
    """Step times of one model on one kind of host, plus what the mock needs to stand in for that model."""

    model: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    context_length: int
    num_pages: int  # the KV pages the real engine derives by default on that host
    threads: int  # torch intra-op threads the measurement used
    host: str  # where it was measured (for the record)
    measured_at: str
    prefill: PrefillTable
    decode: DecodeTable

    @classmethod
    def load(cls, path: str | Path | None = None) -> TimingTable:
        p = Path(path) if path else DEFAULT_TABLE
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ValueError(
                f"--mock-timing-table {p}: cannot read it ({e.strerror}); give a table written by "
                "`python -m shared.engine.mock.fit`"
            ) from None
        try:
            table = msgspec.json.decode(data, type=cls)
        except msgspec.ValidationError as e:
            raise ValueError(f"--mock-timing-table {p}: not a timing table ({e})") from None
        table.check()
        return table

    def dump(self, path: str | Path) -> None:
        Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(self), indent=1) + b"\n")

    def check(self) -> None:
        p, d = self.prefill, self.decode
        if len(p.tokens) < 2 or len(p.tokens) != len(p.ms) or list(p.tokens) != sorted(set(p.tokens)):
            raise ValueError("timing table: prefill needs >= 2 increasing token counts, one time each")
        if (
            len(d.batch) < 2
            or len(d.context) < 2
            or list(d.batch) != sorted(set(d.batch))
            or list(d.context) != sorted(set(d.context))
        ):
            raise ValueError("timing table: decode needs >= 2 increasing batch sizes and contexts")
        if len(d.ms) != len(d.batch) or any(len(row) != len(d.context) for row in d.ms):
            raise ValueError("timing table: decode ms must be [batch][context]")

    # ---- predictions (seconds) ---------------------------------------------------------------------------------
    def prefill_s(self, tokens: int) -> float:
        return max(0.0, _interp(self.prefill.tokens, self.prefill.ms, tokens)) / 1e3

    def decode_s(self, batch: int, mean_context: float) -> float:
        d = self.decode
        rows = [_interp(d.context, row, mean_context) for row in d.ms]  # per measured batch size, at this context
        return max(0.0, _interp(d.batch, rows, batch)) / 1e3

    def step_s(self, prefill_tokens: int, decode_batch: int, decode_context: int) -> float:
        """One step: `prefill_tokens` prompt tokens, `decode_batch` decoding sequences holding `decode_context`
        tokens of context in total."""
        if decode_batch <= 0:
            return self.prefill_s(prefill_tokens) if prefill_tokens > 0 else 0.0
        mean_ctx = decode_context / decode_batch
        if prefill_tokens <= 0:
            return self.decode_s(decode_batch, mean_ctx)
        attention = self.decode_s(decode_batch, mean_ctx) - self.decode_s(decode_batch, self.decode.context[0])
        return self.prefill_s(prefill_tokens + decode_batch) + max(0.0, attention)


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear y(x) through the points, the end segments extended."""
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
