"""Prometheus metrics of the compute services (worker, decode, prefill), under the field's `pdrelay:` names.

Each service owns one registry (served on --metrics-port, see metrics_server.py). Counted on the request path:

    pdrelay:time_to_first_token_seconds   histogram  RPC arrival -> first token sent (decode / worker)
    pdrelay:inter_token_latency_seconds   histogram  between token messages of one request
    pdrelay:e2e_request_latency_seconds   histogram  RPC arrival -> last message of a finished request
    pdrelay:request_errors_total          counter    requests that ended with a pdrelay error, by code
    pdrelay:prefill_queue_time_seconds    histogram  ticket arrival -> the engine accepted it (prefill)
    pdrelay:prefill_compute_seconds       histogram  engine accepted -> first token, prompt KV pinned (prefill)
    pdrelay:kv_transfer_seconds           histogram  one hand-off's KV write (prefill, the writer)
    pdrelay:kv_transfer_bytes_total / pdrelay:kv_transfer_pages_total   counters
    pdrelay:kv_transfer_descriptors_total                               counter (pages merged into descriptors)

and read from the engine at scrape time (EngineCollector; nothing is counted twice on the request path):
    pdrelay:num_requests_running / pdrelay:num_requests_waiting        gauges
    pdrelay:kv_pages_used / _free / _total / _cached, pdrelay:kv_cache_usage_perc
    pdrelay:prompt_tokens_total, pdrelay:generation_tokens_total, pdrelay:num_preemptions_total
    pdrelay:prefix_cache_queries_total / pdrelay:prefix_cache_hits_total (tokens), pdrelay:prefix_cache_hit_rate
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proto.pdrelay.v1 import common_pb2

# Seconds; the same buckets as the gateway's histograms, so the two can be compared bucket by bucket.
TTFT_BUCKETS = (
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
ITL_BUCKETS = (
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
E2E_BUCKETS = (
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
TRANSFER_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def error_label(code: int) -> str:
    """ERROR_CODE_OVERLOADED -> "overloaded" (an unknown number keeps its value)."""
    try:
        return common_pb2.ErrorCode.Name(code).removeprefix("ERROR_CODE_").lower()
    except ValueError:
        return str(code)


class ServiceMetrics:
    """The registry of one service and the metrics its request path updates."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.errors = Counter(
            "pdrelay:request_errors", "Requests that ended with a pdrelay error, by error code", ("code",), registry=r
        )
        self._error_children: dict[int, Any] = {}
        self._requests: RequestMetrics | None = None
        self._prefill: PrefillMetrics | None = None

    def count_error(self, code: int) -> None:
        child = self._error_children.get(code)
        if child is None:
            child = self._error_children[code] = self.errors.labels(error_label(code))
        child.inc()

    @property
    def requests(self) -> RequestMetrics:
        """TTFT / ITL / e2e histograms, created on first use (only the roles that stream tokens export them)."""
        if self._requests is None:
            self._requests = RequestMetrics(self.registry)
        return self._requests

    @property
    def prefill(self) -> PrefillMetrics:
        if self._prefill is None:
            self._prefill = PrefillMetrics(self.registry)
        return self._prefill


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "pdrelay:time_to_first_token_seconds",
            "RPC arrival to first token sent",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "pdrelay:inter_token_latency_seconds",
            "Time between token messages of one request",
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "pdrelay:e2e_request_latency_seconds",
            "RPC arrival to the last message of a finished request",
            buckets=E2E_BUCKETS,
            registry=registry,
        )


class PrefillMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.queue = Histogram(
            "pdrelay:prefill_queue_time_seconds",
            "Hand-off ticket arrival to the engine accepting the request",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.compute = Histogram(
            "pdrelay:prefill_compute_seconds",
            "Engine accepted the request to first token with its prompt KV pinned",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.transfer = Histogram(
            "pdrelay:kv_transfer_seconds",
            "KV write of one hand-off into decode's pages",
            buckets=TRANSFER_BUCKETS,
            registry=registry,
        )
        self.transfer_bytes = Counter(
            "pdrelay:kv_transfer_bytes", "KV bytes written into decode instances", registry=registry
        )
        self.transfer_pages = Counter(
            "pdrelay:kv_transfer_pages", "KV pages written into decode instances", registry=registry
        )
        # pages / descriptors = how well hand-offs coalesce (each descriptor has a fixed cost in the backend)
        self.transfer_descs = Counter(
            "pdrelay:kv_transfer_descriptors",
            "Transfer descriptors the KV writes became after merging pages contiguous on both sides",
            registry=registry,
        )


class EngineCollector(Collector):
    """Engine state at scrape time. `stats` returns shared.engine.engine.EngineStats, or None before the engine is
    loaded (the metrics are then absent rather than zero)."""

    def __init__(self, stats: Callable[[], Any | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        if s is None:
            return
        used = s.num_total_pages - s.num_free_pages - s.num_evictable_pages
        yield GaugeMetricFamily("pdrelay:num_requests_running", "Requests in the running batch", value=s.num_running)
        yield GaugeMetricFamily("pdrelay:num_requests_waiting", "Requests waiting to be scheduled", value=s.num_waiting)
        yield GaugeMetricFamily(
            "pdrelay:kv_pages_used", "KV pages held by requests (not free, not evictable)", value=used
        )
        yield GaugeMetricFamily(
            "pdrelay:kv_pages_free",
            "KV pages a new request could take (free + evictable cached)",
            value=s.num_free_pages + s.num_evictable_pages,
        )
        yield GaugeMetricFamily("pdrelay:kv_pages_cached", "KV pages in the prefix cache", value=s.num_cached_pages)
        yield GaugeMetricFamily("pdrelay:kv_pages_total", "KV pages in the pool", value=s.num_total_pages)
        yield GaugeMetricFamily(
            "pdrelay:kv_cache_usage_perc",
            "Share of the KV pool held by requests (0..1)",
            value=used / s.num_total_pages if s.num_total_pages else 0.0,
        )
        yield CounterMetricFamily("pdrelay:prompt_tokens", "Prompt tokens admitted", value=s.num_prompt_tokens)
        yield CounterMetricFamily("pdrelay:generation_tokens", "Tokens generated", value=s.num_generated_tokens)
        yield CounterMetricFamily("pdrelay:num_preemptions", "Requests preempted for KV pages", value=s.num_preemptions)
        yield CounterMetricFamily(
            "pdrelay:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", value=s.num_prompt_tokens
        )
        yield CounterMetricFamily(
            "pdrelay:prefix_cache_hits", "Prompt tokens found in the prefix cache", value=s.num_cached_prompt_tokens
        )
        yield GaugeMetricFamily(
            "pdrelay:prefix_cache_hit_rate",
            "Prefix-cache hits / queries since start (tokens)",
            value=s.num_cached_prompt_tokens / s.num_prompt_tokens if s.num_prompt_tokens else 0.0,
        )
        # Where the engine thread's time goes: busy = the sum over phases; wall time minus busy = waiting for work.
        yield CounterMetricFamily("pdrelay:engine_steps", "Engine steps run", value=s.num_steps)
        phases = CounterMetricFamily("pdrelay:engine_step_seconds", "Engine step time by phase", labels=["phase"])
        t = s.totals
        for phase, v in (
            ("schedule", t.schedule_s),
            ("prepare", t.prepare_s),
            ("forward", t.forward_s),
            ("sample", t.sample_s),
            ("update", t.update_s),
        ):
            phases.add_metric([phase], v)
        yield phases
        yield CounterMetricFamily(
            "pdrelay:engine_step_tokens", "Tokens through the model in engine steps", value=t.num_tokens
        )


class CountersCollector(Collector):
    """Counters kept as plain attributes of an object (e.g. the decode's hand-off client), read at scrape time:
    [(metric name, help, attribute), ...]."""

    def __init__(self, owner: object, counters: list[tuple[str, str, str]]) -> None:
        self._owner = owner
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        for name, help_text, attr in self._counters:
            yield CounterMetricFamily(name, help_text, value=getattr(self._owner, attr))
