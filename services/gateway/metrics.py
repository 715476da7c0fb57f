"""Prometheus metrics of the gateway (vLLM-style names under the `pdrelay:` prefix).

Each app owns its registry, so several apps in one process (tests) do not collide and /metrics shows only
this gateway. TTFT is measured from request arrival to the first token chunk, ITL between token chunks (one
chunk is one decode step), e2e from arrival to the last byte sent.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds, the engines' buckets (low ones matter too: with mock workers a request takes about a millisecond), so
# the gateway's and the engines' histograms compare bucket by bucket.
from shared.telemetry.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS

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
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "pdrelay:inter_token_latency_seconds",
            "Time between token chunks of one request",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "pdrelay:e2e_request_latency_seconds",
            "Request arrival to last byte of the answer",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("pdrelay:prompt_tokens", "Prompt tokens of served requests", registry=r)
        # counted when a request arrives (the counters above when it ends): the planner's forecast reads the mix
        # of the traffic coming in, not of what finished a request's lifetime ago
        self.admitted = Counter("pdrelay:admitted_requests", "Generation requests admitted", registry=r)
        self.admitted_prompt_tokens = Counter(
            "pdrelay:admitted_prompt_tokens", "Prompt tokens of admitted generation requests", registry=r
        )
        self.generation_tokens = Counter(
            "pdrelay:generation_tokens", "Tokens generated for served requests", registry=r
        )
        # labels() costs a few microseconds per call; the set of (endpoint, status) pairs is small.
        self._children: dict[tuple[str, int], Counter] = {}

    def started(self, prompt_tokens: int) -> None:
        """A generation request begins (both front doors)."""
        self.in_flight.inc()
        self.admitted.inc()
        self.admitted_prompt_tokens.inc(prompt_tokens)

    def ended(self, prompt_tokens: int, generated: int) -> None:
        self.in_flight.dec()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)

    def count_request(self, endpoint: str, status: int) -> None:
        key = (endpoint, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._requests.labels(endpoint, str(status))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
