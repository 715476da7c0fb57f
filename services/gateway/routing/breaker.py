"""The gateway's per-instance circuit breakers: shared.cluster.breaker (decode uses the same ones for prefills)."""

from shared.cluster.breaker import BreakerBoard, BreakerConfig, BreakerState, CircuitBreaker, Clock

__all__ = ["BreakerBoard", "BreakerConfig", "BreakerState", "CircuitBreaker", "Clock"]
