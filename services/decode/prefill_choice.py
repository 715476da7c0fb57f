"""Which prefill a decode hands a prompt to, and how long it waits for the answer.

    breakers   one circuit breaker per prefill instance (shared.cluster.breaker, the gateway's kind): consecutive
               failed hand-offs (timeouts, transfer errors, bad checksums, crashes) open it, so a hung or corrupting
               prefill leaves this decode's rotation after a few requests instead of costing every request a failed
               attempt; after the cool-down one hand-off probes it and its success returns it
    deadline   a hand-off's deadline follows its prompt: a few times what the prompt should take at the prefill rate
               this decode measured (with its other hand-offs in flight counted as queue ahead of it), never under
               `--handoff-min-timeout-s` nor over `--handoff-timeout-s`; until a first hand-off was measured, the
               whole `--handoff-timeout-s` (start-up: connections and caches are cold)
               (a silent or wedged prefill is caught sooner than that by liveness.py: health probes, and a short
               write deadline once the prompt is computed)
    refusals   which failed attempts certainly wrote nothing (the prefill refused the ticket): their pages are freed
               at once instead of quarantined

Pure bookkeeping, no I/O: unit-tested with a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from proto.pdrelay.v1 import common_pb2
from shared.cluster.breaker import BreakerBoard, BreakerConfig, Clock

_E = common_pb2

# Typed refusals a prefill answers before it touches decode's pages (validation, fencing, admission, drain).
REFUSED_BEFORE_WRITE = frozenset(
    {
        _E.ERROR_CODE_INVALID_ARGUMENT,
        _E.ERROR_CODE_REQUEST_FAILED,  # its first token failed: the pages are written only after it
        _E.ERROR_CODE_LAYOUT_MISMATCH,
        _E.ERROR_CODE_STALE_EPOCH,
        _E.ERROR_CODE_OVERLOADED,
        _E.ERROR_CODE_DRAINING,
        _E.ERROR_CODE_UNAVAILABLE,
    }
)
# Refusals that are the protocol working (busy, draining, fenced), not a sick prefill: no breaker failure.
_NOT_SICK = frozenset(
    {
        _E.ERROR_CODE_OVERLOADED,
        _E.ERROR_CODE_DRAINING,
        _E.ERROR_CODE_STALE_EPOCH,
        _E.ERROR_CODE_INVALID_ARGUMENT,
        _E.ERROR_CODE_CANCELLED,
        _E.ERROR_CODE_REQUEST_FAILED,  # the request's own failure: it fails the same way on every prefill
    }
)

# Deadline = FIXED_S + SLACK x (expected prefill time of the prompt and of the queue ahead of it).
FIXED_S = 1.0  # connection, scheduling and transfer overhead of any hand-off
SLACK = 4.0  # how much slower than measured a healthy prefill may be (a busy box, a burst from other decodes)
_EWMA = 0.2  # weight of the newest measurement of the prefill rate


def is_refusal(code: int, typed: bool) -> bool:
    """Did the prefill refuse the ticket before writing anything (pages may be freed at once)?"""
    return typed and code in REFUSED_BEFORE_WRITE


def is_sick(code: int, typed: bool) -> bool:
    """Does the failed attempt count against the prefill's breaker? Untyped failures (unreachable, reset, deadline
    exceeded) always do; typed ones unless they are the protocol at work."""
    return not typed or code not in _NOT_SICK


@dataclass(frozen=True)
class Attempt:
    instance_id: str
    prompt_tokens: int
    ahead_tokens: int  # prompt tokens of this decode's other hand-offs in flight when it started
    deadline_s: float


class PrefillChoice:
    def __init__(
        self,
        *,
        max_timeout_s: float,
        min_timeout_s: float,
        breaker: BreakerConfig = BreakerConfig(failure_threshold=2),
        clock: Clock = time.monotonic,
    ) -> None:
        self.max_timeout_s = max_timeout_s
        self.min_timeout_s = min(min_timeout_s, max_timeout_s)
        self.breakers = BreakerBoard(breaker, clock)
        self.tokens_per_s: float | None = None  # measured prefill rate (prompt tokens / hand-off second)
        self._in_flight_tokens = 0

    # ---- whom to ask -------------------------------------------------------------------------------------------
    def order(self, targets: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """`targets` (the gateway's choice first, then alternates) without the ones whose breaker is open; when
        every breaker is open, all of them (a failed hand-off is retried, a refused request is not served)."""
        allowed = [t for t in targets if self.breakers.allows(t[0])]
        return allowed or list(targets)

    def attempt(self, instance_id: str, prompt_tokens: int) -> Attempt:
        """A hand-off to `instance_id` starts now (with its deadline). Call `done()` when it ends, always."""
        self.breakers.get(instance_id).on_attempt()
        a = Attempt(instance_id, prompt_tokens, self._in_flight_tokens, self.deadline_s(prompt_tokens))
        self._in_flight_tokens += prompt_tokens
        return a

    def done(self, a: Attempt, seconds: float, *, ok: bool, sick: bool, silent: bool = False) -> None:
        """`silent`: the prefill stopped answering health probes (liveness.py): its breaker opens at once."""
        self._in_flight_tokens = max(0, self._in_flight_tokens - a.prompt_tokens)
        b = self.breakers.get(a.instance_id)
        if ok:
            b.on_success()
            # The prompts in flight before it were (roughly) computed in the same time: count them, so a burst
            # does not read as a slow prefill.
            rate = (a.prompt_tokens + a.ahead_tokens) / max(seconds, 1e-3)
            self.tokens_per_s = rate if self.tokens_per_s is None else (1 - _EWMA) * self.tokens_per_s + _EWMA * rate
        elif silent:
            b.trip("it stopped answering health probes")
        elif sick:
            b.on_failure()
        else:
            b.on_abandoned()

    def forget(self, instance_id: str) -> None:
        """The prefill re-registered (a new epoch) or left: its history is over."""
        self.breakers.remove(instance_id)

    # ---- how long to wait --------------------------------------------------------------------------------------
    def deadline_s(self, prompt_tokens: int) -> float:
        if self.tokens_per_s is None:
            return self.max_timeout_s
        expected = (prompt_tokens + self._in_flight_tokens) / self.tokens_per_s
        return min(self.max_timeout_s, max(self.min_timeout_s, FIXED_S + SLACK * expected))
