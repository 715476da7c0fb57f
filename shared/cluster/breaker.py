"""Circuit breakers, one per instance: stop sending requests to an instance that keeps failing.

    closed     requests flow; `failure_threshold` consecutive server-side failures open the breaker
    open       no requests for `cooldown_s` (doubling after every failed probe, up to `max_cooldown_s`)
    half-open  after the cool-down, exactly one probe request is let through; its success closes the breaker,
               its failure opens it again

Only server-side failures count (the instance is unreachable, crashed, timed out, or failed internally). A request the
instance refused because the request is bad, or because the instance is busy or draining, says nothing about its
health and never opens the breaker (the callers decide: services/gateway/routing/failures.py for decode instances,
services/decode/prefill_choice.py for the prefills a decode hands prompts to). Time comes from an injectable clock
so tests need no sleeps.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int = 3
    cooldown_s: float = 2.0
    max_cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"breaker failure_threshold must be >= 1 (got {self.failure_threshold}); try 3")
        if not 0 < self.cooldown_s <= self.max_cooldown_s:
            raise ValueError(
                f"breaker cooldown_s must be in (0, max_cooldown_s={self.max_cooldown_s}] "
                f"(got {self.cooldown_s}); try 2"
            )


class CircuitBreaker:
    def __init__(self, name: str, config: BreakerConfig = BreakerConfig(), clock: Clock = time.monotonic) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0  # consecutive server-side failures while closed
        self._opened_at = 0.0
        self._cooldown = config.cooldown_s
        self._probe_in_flight = False
        self.times_opened = 0

    @property
    def state(self) -> BreakerState:
        """The state now (an open breaker whose cool-down has passed reads as half-open)."""
        if self._state == BreakerState.OPEN and self._clock() - self._opened_at >= self._cooldown:
            return BreakerState.HALF_OPEN
        return self._state

    def allows(self) -> bool:
        """May a request be sent now? Does not change anything (ranking calls it for every candidate)."""
        state = self.state
        if state == BreakerState.CLOSED:
            return True
        return state == BreakerState.HALF_OPEN and not self._probe_in_flight

    def on_attempt(self) -> None:
        """A request is being sent to the instance; in half-open state it is the one probe."""
        if self.state == BreakerState.HALF_OPEN:
            self._state = BreakerState.HALF_OPEN
            self._probe_in_flight = True

    def on_success(self) -> None:
        if self._state != BreakerState.CLOSED:
            log.info("circuit breaker of %s closed: the probe request succeeded", self.name)
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._cooldown = self.config.cooldown_s
        self._probe_in_flight = False

    def on_failure(self) -> None:
        """A server-side failure of a request sent to this instance."""
        state = self.state
        if state == BreakerState.HALF_OPEN:
            self._cooldown = min(self._cooldown * 2, self.config.max_cooldown_s)
            self._open("the probe request failed")
            return
        if state == BreakerState.OPEN:
            return  # a request sent before it opened failed too: nothing new
        self._failures += 1
        if self._failures >= self.config.failure_threshold:
            self._open(f"{self._failures} consecutive failures")

    def trip(self, why: str) -> None:
        """Open now, whatever the count: the instance is known to be gone or silent (not merely an outlier)."""
        if self.state != BreakerState.OPEN:
            self._open(why)

    def on_abandoned(self) -> None:
        """The request ended without saying anything about the instance (client gone, refused as overloaded)."""
        self._probe_in_flight = False

    def _open(self, why: str) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._probe_in_flight = False
        self._failures = 0
        self.times_opened += 1
        log.warning("circuit breaker of %s opened (%s); next probe in %.1f s", self.name, why, self._cooldown)


class BreakerBoard:
    """Breakers by instance id, created on first use."""

    def __init__(self, config: BreakerConfig = BreakerConfig(), clock: Clock = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, instance_id: str) -> CircuitBreaker:
        b = self._breakers.get(instance_id)
        if b is None:
            b = self._breakers[instance_id] = CircuitBreaker(instance_id, self.config, self._clock)
        return b

    def allows(self, instance_id: str) -> bool:
        b = self._breakers.get(instance_id)
        return b is None or b.allows()

    def remove(self, instance_id: str) -> None:
        self._breakers.pop(instance_id, None)

    def states(self) -> dict[str, BreakerState]:
        return {k: b.state for k, b in sorted(self._breakers.items())}
