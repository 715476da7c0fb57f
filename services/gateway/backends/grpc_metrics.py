"""Prometheus view of the routed backend, read at scrape time (nothing is counted twice on the request path).

Registered on the HTTP app's registry by the gateway service, so /metrics shows routing next to the HTTP metrics:
retries, stream replays, cancels, circuit breakers by state, ready instances by role, KV index size and gaps, the
KV index's state per instance (exact / degraded / rebuilding) and its snapshots, and whether discovery is running on
a stale view.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.gateway.routing.breaker import BreakerState
from services.gateway.routing.discovery import ROUTED_ROLES
from services.gateway.routing.kv_index import IndexState, KVIndex
from services.gateway.routing.kv_sync import KVIndexSync

if TYPE_CHECKING:
    from services.gateway.backends.grpc_backend import GrpcBackend


class BackendCollector(Collector):
    def __init__(self, backend: GrpcBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        b = self.backend
        router = b.router
        yield CounterMetricFamily(
            "pdrelay:gateway_retries", "Attempts after a failed one (replays included)", value=b.retries
        )
        yield CounterMetricFamily(
            "pdrelay:gateway_replays", "Broken streams continued on another instance", value=b.replays
        )
        yield CounterMetricFamily(
            "pdrelay:gateway_cancels", "Cancels published for requests the client left", value=b.cancels_published
        )
        states = Counter(router.breakers.states().values())
        g = GaugeMetricFamily("pdrelay:gateway_circuit_breakers", "Circuit breakers by state", labels=("state",))
        for state in BreakerState:
            g.add_metric((state.value,), states.get(state, 0))
        yield g
        membership = b.discovery.membership
        ready = GaugeMetricFamily(
            "pdrelay:gateway_instances_ready", "Ready instances the gateway routes to", labels=("role",)
        )
        for role in ROUTED_ROLES:
            ready.add_metric((role,), len(membership.ready(role)))
        yield ready
        yield GaugeMetricFamily(
            "pdrelay:gateway_discovery_stale",
            "1 while etcd is unreachable (last known view)",
            value=1.0 if membership.stale else 0.0,
        )
        idx = router.kv_index
        yield GaugeMetricFamily(
            "pdrelay:gateway_kv_index_pages",
            "Page hashes held in the KV index, all instances",
            value=sum(idx.num_pages(i) for i in idx.instances()),
        )
        yield CounterMetricFamily(
            "pdrelay:gateway_kv_event_gaps", "KV event sequence gaps (an instance was reset)", value=idx.stats.gaps
        )
        yield from kv_index_metrics(idx, b.discovery.kv_sync)


def kv_index_metrics(idx: KVIndex, sync: KVIndexSync | None) -> Iterator[Metric]:
    """The KV index per instance: one series per state (1 for the current one), and its pages."""
    state = GaugeMetricFamily(
        "pdrelay:gateway_kv_index_state",
        "KV index state of each instance (1 = current): only exact entries earn prefix credit in routing",
        labels=("instance", "state"),
    )
    pages = GaugeMetricFamily(
        "pdrelay:gateway_kv_index_instance_pages", "Page hashes the KV index holds per instance", labels=("instance",)
    )
    for e in idx.entries():
        for st in IndexState:
            state.add_metric((e.instance_id, st.value), 1.0 if e.state == st else 0.0)
        pages.add_metric((e.instance_id,), e.pages)
    yield state
    yield pages
    yield GaugeMetricFamily(
        "pdrelay:gateway_kv_index_entries", "(hash, instance) entries in the KV index", value=idx.holders.refs
    )
    yield GaugeMetricFamily(
        "pdrelay:gateway_kv_index_max_entries", "Bound on the KV index's entries", value=idx.max_entries
    )
    yield GaugeMetricFamily(
        "pdrelay:gateway_kv_index_bytes", "Estimated memory of the KV index", value=idx.approx_bytes()
    )
    yield CounterMetricFamily(
        "pdrelay:gateway_kv_index_snapshots", "Instance snapshots applied to the KV index", value=idx.stats.snapshots
    )
    yield CounterMetricFamily(
        "pdrelay:gateway_kv_index_snapshot_failures",
        "Snapshots asked for and not received (the instance is routed by load meanwhile)",
        value=sync.stats.failed if sync is not None else 0,
    )
