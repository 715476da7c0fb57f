"""Prometheus metrics of the gateway (vLLM-style names under the `pdrelay:` prefix).

Each app owns its registry, so several apps in one process (tests) do not collide and /metrics shows only
this gateway. TTFT is measured from request arrival to the first token chunk, ITL between token chunks (one
chunk is one decode step), e2e from arrival to the last byte sent.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds. Low buckets matter too: with mock workers the whole request takes about a millisecond.
_TTFT_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
_ITL_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    80.0,
)
_E2E_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "pdrelay:http_requests",
            "HTTP requests answered, by endpoint and status code",
            ("endpoint", "status"),
            registry=r,
        )
        self.in_flight = Gauge("pdrelay:http_requests_in_flight", "Generation requests being served now", registry=r)
        self.ttft = Histogram(
            "pdrelay:time_to_first_token_seconds",
            "Request arrival to first generated token",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "pdrelay:inter_token_latency_seconds",
            "Time between token chunks of one request",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "pdrelay:e2e_request_latency_seconds",
            "Request arrival to last byte of the answer",
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("pdrelay:prompt_tokens", "Prompt tokens of served requests", registry=r)
        self.generation_tokens = Counter(
            "pdrelay:generation_tokens", "Tokens generated for served requests", registry=r
        )
        # labels() costs a few microseconds per call; the set of (endpoint, status) pairs is small.
        self._children: dict[tuple[str, int], Counter] = {}

    def count_request(self, endpoint: str, status: int) -> None:
        key = (endpoint, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._requests.labels(endpoint, str(status))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
