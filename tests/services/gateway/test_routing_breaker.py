"""Circuit breakers: open after consecutive server-side failures, half-open after the cool-down, one probe."""

from __future__ import annotations

import pytest

from services.gateway.routing.breaker import BreakerBoard, BreakerConfig, BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(threshold: int = 3, cooldown: float = 2.0, max_cooldown: float = 8.0) -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    return CircuitBreaker("d1", BreakerConfig(threshold, cooldown, max_cooldown), clock), clock


def test_opens_after_consecutive_failures_only() -> None:
    b, _ = make(threshold=3)
    b.on_failure()
    b.on_failure()
    b.on_success()  # a success in between resets the count
    b.on_failure()
    b.on_failure()
    assert b.state == BreakerState.CLOSED and b.allows()
    b.on_failure()
    assert b.state == BreakerState.OPEN and not b.allows()
    assert b.times_opened == 1


def test_half_open_lets_exactly_one_probe_through() -> None:
    b, clock = make(threshold=1, cooldown=2.0)
    b.on_failure()
    clock.t += 1.99
    assert not b.allows()
    clock.t += 0.02
    assert b.state == BreakerState.HALF_OPEN and b.allows()
    b.on_attempt()
    assert not b.allows(), "a second request while the probe is in flight must wait"
    b.on_success()
    assert b.state == BreakerState.CLOSED and b.allows()


def test_failed_probe_reopens_with_a_longer_cooldown() -> None:
    b, clock = make(threshold=1, cooldown=2.0, max_cooldown=5.0)
    b.on_failure()
    clock.t += 2.0
    b.on_attempt()
    b.on_failure()
    assert b.state == BreakerState.OPEN
    clock.t += 3.9
    assert not b.allows(), "the cool-down doubled to 4 s"
    clock.t += 0.1
    assert b.allows()
    b.on_attempt()
    b.on_failure()
    clock.t += 4.99
    assert not b.allows()
    clock.t += 0.01
    assert b.allows(), "capped at max_cooldown_s = 5, not 8"
    b.on_attempt()
    b.on_success()
    b.on_failure()  # back to the configured cool-down after closing
    clock.t += 2.0
    assert b.allows()


def test_abandoned_probe_frees_the_slot() -> None:
    b, clock = make(threshold=1)
    b.on_failure()
    clock.t += 5
    b.on_attempt()
    b.on_abandoned()  # client disconnected, or the instance said "busy": no verdict
    assert b.state == BreakerState.HALF_OPEN and b.allows()


def test_failures_while_open_do_not_extend_it() -> None:
    b, clock = make(threshold=1, cooldown=2.0)
    b.on_failure()
    clock.t += 1.5
    b.on_failure()  # a request sent before it opened failed late
    clock.t += 0.5
    assert b.allows()


def test_board_and_config_checks() -> None:
    board = BreakerBoard(BreakerConfig(failure_threshold=1))
    assert board.allows("x")
    board.get("x").on_failure()
    assert not board.allows("x")
    assert board.states() == {"x": BreakerState.OPEN}
    board.remove("x")
    assert board.allows("x")
    with pytest.raises(ValueError, match="failure_threshold"):
        BreakerConfig(failure_threshold=0)
    with pytest.raises(ValueError, match="cooldown_s"):
        BreakerConfig(cooldown_s=10, max_cooldown_s=5)
