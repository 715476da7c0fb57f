"""Stop strings over streamed text: the match may span any number of chunks.

The gateway is authoritative for stop strings. Text that could still turn into a stop string is held back: the
longest suffix of what arrived that is a proper prefix of some stop string. A stop string that starts inside
already emitted text is impossible, because that text would have been such a suffix and held back; so each
step only searches the held-back tail plus the new text. The hold-back check only tries prefix lengths whose
last character matches the text's last character, so a step usually costs O(new text + total stop length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopScan:
    text: str  # safe to emit now
    matched: str | None  # the stop string that ended the output, if any


class StopStringMatcher:
    """Per-request state. feed() each decoded piece; flush() at the end of the stream.

    The output ends at the first stop string to be complete in the text (the earliest end; at equal ends the
    longest), which is what a character-by-character stream would see, so the result never depends on how the
    text was chunked.
    """

    __slots__ = ("_stops", "_include", "_pending", "_done")

    def __init__(self, stops: Sequence[str], *, include_stop_str_in_output: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError(f"stop strings must be non-empty (got {list(stops)!r})")
        self._stops = tuple(dict.fromkeys(stops))  # dedupe, keep order
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
            # The stop string completed first wins, whatever the chunking; at equal ends the longer one.
            if at >= 0 and (
                best is None
                or at + len(s) < best_at + len(best)
                or (at + len(s) == best_at + len(best) and len(s) > len(best))
            ):
                best_at, best = at, s
        if best is not None:
            self._done = True
            self._pending = ""
            end = best_at + len(best) if self._include else best_at
            return StopScan(buf[:end], best)
        hold = self._partial_stop_len(buf)
        self._pending = buf[len(buf) - hold :] if hold else ""
        return StopScan(buf[: len(buf) - hold], None)

    def _partial_stop_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string (0: none)."""
        if not buf:
            return 0
        last = buf[-1]
        best = 0
        for s in self._stops:
            k = min(len(s) - 1, len(buf))
            while k > best:
                k = s.rfind(last, 0, k) + 1  # the longest prefix of length <= k that ends with `last`
                if k <= best:
                    break
                if buf.endswith(s[:k]):
                    best = k
                    break
                k -= 1
        return best

    def flush(self) -> str:
        """The held-back tail, when the stream ended without completing a stop string."""
        out, self._pending = self._pending, ""
        return out
