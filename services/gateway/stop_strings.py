"""Stop strings over streamed text: the match may span any number of chunks.

The gateway is authoritative for stop strings. Text that could still turn into a stop string is held back: the
longest suffix of what arrived that is a proper prefix of some stop string. A stop string that starts inside
already emitted text is impossible, because that text would have been such a suffix and held back; so each
step only searches the held-back tail plus the new text, O(new + longest stop) per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopScan:
    text: str  # safe to emit now
    matched: str | None  # the stop string that ended the output, if any


class StopStringMatcher:
    """Per-request state. feed() each decoded piece; flush() at the end of the stream."""

    __slots__ = ("_stops", "_prefixes", "_max_hold", "_include", "_pending", "_done")

    def __init__(self, stops: Sequence[str], *, include_stop_str_in_output: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError(f"stop strings must be non-empty (got {list(stops)!r})")
        self._stops = tuple(dict.fromkeys(stops))  # dedupe, keep order
        # Every proper prefix of every stop string: a held-back tail must be one of these.
        self._prefixes = frozenset(s[:i] for s in self._stops for i in range(1, len(s)))
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._include = include_stop_str_in_output
        self._pending = ""
        self._done = False

    @property
    def held_back(self) -> str:
        return self._pending

    def feed(self, piece: str) -> StopScan:
        assert not self._done, "feed() after a stop string matched"
        if not self._stops:
            return StopScan(piece, None)
        buf = self._pending + piece
        best_at, best = -1, None
        for s in self._stops:
            at = buf.find(s)
            # The earliest match wins; at equal starts the longer string (it contains the shorter).
            if at >= 0 and (best is None or at < best_at or (at == best_at and len(s) > len(best))):
                best_at, best = at, s
        if best is not None:
            self._done = True
            self._pending = ""
            end = best_at + len(best) if self._include else best_at
            return StopScan(buf[:end], best)
        hold = 0
        for k in range(min(self._max_hold, len(buf)), 0, -1):
            if buf[-k:] in self._prefixes:
                hold = k
                break
        self._pending = buf[len(buf) - hold :] if hold else ""
        return StopScan(buf[: len(buf) - hold], None)

    def flush(self) -> str:
        """The held-back tail, when the stream ended without completing a stop string."""
        out, self._pending = self._pending, ""
        return out
